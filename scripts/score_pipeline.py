#!/usr/bin/env python
"""Score a saved model folder through the README's pipeline line and compare with what its model card says.

    python scripts/score_pipeline.py runs/mgsa-multi30k

Translates a split with `pipeline("translation", model=folder)` and no decoding arguments (the folder's generation
config decides), scores it with sacreBLEU, and prints it beside the card's `model-index` BLEU for that split and how
many translations stopped at the generation config's length bound.
"""

import argparse
import json
from pathlib import Path

from huggingface_hub import ModelCard
from transformers import GenerationConfig, pipeline

import mgsa_hf  # noqa: F401  (registers the translation task)
from mgsa_hf.evaluation import translation_scores
from mgsa_hf.tokenization_utils import read_lines


REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--split", default="test_2016_flickr", help="the corpus file's split name")
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="de")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--output", help="write the comparison as JSON here")
    args = parser.parse_args(argv)

    sources = list(read_lines(Path(args.data) / f"{args.split}.{args.source_lang}.gz"))
    references = list(read_lines(Path(args.data) / f"{args.split}.{args.target_lang}.gz"))
    translator = pipeline("translation", model=args.folder)  # the README's line
    outputs = translator(sources, batch_size=args.batch_size)
    translations = [row["translation_text"] for row in outputs]
    scores = translation_scores(translations, references)

    generation = GenerationConfig.from_pretrained(args.folder)
    token_counts = [len(translator.tokenizer(text).input_ids) for text in translations]
    at_bound = sum(count >= generation.max_length - 1 for count in token_counts)  # decoder start not counted
    card = ModelCard.load(Path(args.folder) / "README.md")
    card_bleu = next((result.metric_value for result in card.data.eval_results or []
                      if result.metric_type == "bleu" and result.dataset_split in (args.split, "test")), None)
    report = {
        "folder": args.folder, "split": args.split, "pipeline_bleu": scores["bleu"], "card_bleu": card_bleu,
        "difference": None if card_bleu is None else scores["bleu"] - card_bleu,
        "distinct_fraction": scores["distinct_fraction"], "num_beams": generation.num_beams,
        "max_length": generation.max_length, "translations_at_max_length": at_bound,
        "bleu_signature": scores["bleu_signature"],
    }
    print(json.dumps(report, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
