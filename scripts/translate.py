#!/usr/bin/env python
"""Translate sentences (one per line) with a saved MGSA model folder, in batches, through the translation pipeline.

Decoding follows the model's generation config (its folder's `generation_config.json`: beam size, length bound)
unless `--num-beams`, `--max-length` or `--max-new-tokens` say otherwise.

    echo "A man rides a bike." | python scripts/translate.py runs/mgsa-multi30k
    python scripts/translate.py runs/mgsa-multi30k --input test.en --output test.hyp.de --num-beams 4
"""

import argparse
import sys

from tqdm import tqdm
from transformers import pipeline

import mgsa_hf  # noqa: F401  (registers the translation pipeline)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="saved model folder (model + processor)")
    parser.add_argument("--input", help="file of source sentences (default: standard input)")
    parser.add_argument("--output", help="file for the translations (default: standard output)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-beams", type=int, help="beam size (default: the model's generation config)")
    parser.add_argument("--max-length", type=int,
                        help="most tokens of a translation, EOS included (default: the model's generation config)")
    parser.add_argument("--max-new-tokens", type=int,
                        help="most tokens of a translation, instead of --max-length (default: the model's "
                             "generation config)")
    parser.add_argument("--max-source-length", type=int,
                        help="cut source sentences to this many tokens (default: none is cut)")
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    source = open(args.input, encoding="utf-8") if args.input else sys.stdin
    sentences = [line.rstrip("\n") for line in source]
    options = {name: getattr(args, name) for name in ("num_beams", "max_length", "max_new_tokens", "max_source_length")
               if getattr(args, name) is not None}
    translator = pipeline("translation", model=args.model, device=args.device)
    output = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    # a generator in, translations streamed out as each batch is done
    rows = translator((sentence for sentence in sentences), batch_size=args.batch_size, **options)
    for (row,) in tqdm(rows, total=len(sentences), desc="translating", unit="sentence", disable=args.input is None):
        output.write(row["translation_text"] + "\n")
    output.flush()


if __name__ == "__main__":
    main()
