"""Model cards for trained MGSA models: the variant, its paper, the data, the hyperparameters and measured scores."""

import dataclasses
import json
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .syntax_spacy import DEFAULT_PARSERS


TEMPLATE = Path(__file__).with_name("model_card_template.md")

# (corpus folder name, language pair) -> the Hub dataset id and the name a card gives a local copy of a corpus that is
# published on the Hub; other local corpora are named by their folder and get no id
HUB_DATASETS = {
    ("multi30k", frozenset({"en", "de"})): ("bentrevett/multi30k", "Multi30k (task 1, en-de)"),
}

# config.backbone -> how the card names the architecture
BACKBONE_NAMES = {"marian": "Marian-style", "t5": "T5-style"}

def variant_settings(config) -> dict:
    """The config fields that define the encoder variant (its `config_fields`)."""
    fields = config.variant.config_fields
    names = {field.name for field in dataclasses.fields(fields)} if fields else set()
    return {key: value for key, value in config.to_dict().items() if key in names}


def card_dataset(data: str | Path, source_lang: str, target_lang: str) -> tuple[str | None, str]:
    """
    The Hub dataset id (None where there is none) and the name by which a card names the corpus `data` (a training
    config's `data`): a Hub dataset id names itself; a local copy of a corpus published on the Hub, recognised by its
    folder name and language pair ([`HUB_DATASETS`]: `multi30k` en-de is `bentrevett/multi30k`), gets that id; any
    other folder or file is named by its name alone.
    """
    text = str(data)
    path = Path(text)
    if not path.exists() and path.suffix != ".jsonl" and not text.startswith((".", "/")):
        return text, text  # read with `datasets.load_dataset`: a Hub id
    name = path.stem if path.suffix == ".jsonl" else path.name
    return HUB_DATASETS.get((name.lower(), frozenset({source_lang, target_lang})), (None, name))


def build_model_card(
    config,
    *,
    model_id: str,
    source_lang: str,
    target_lang: str,
    dataset_name: str,
    train_size: int,
    hyperparameters: dict,
    results: list[dict],
    parser: str | None,
    tree_source: str | None = None,
    dataset_id: str | None = None,
    generation_config=None,
    example_source: str = "A man rides a bike.",
) -> ModelCard:
    """
    Fill the card template.

    `results` is a list of `{"split": ..., "bleu": ..., "chrf": ..., "bleu_signature": ...}`, `split` the corpus's
    name for it (`test_2016_flickr`); each score goes into the card's `model-index` as an evaluation result on the
    dataset `dataset_id` (its Hub id, see [`card_dataset`]; `dataset_name` where there is none), which the metadata
    also lists under `datasets`. `tree_source` says where the constituency trees come from (see
    [`describe_tree_source`]); `generation_config` (the model's) gives the decoding settings the card states.
    """
    summary, paper = config.variant.summary, config.variant.paper
    eval_results = [
        EvalResult(
            task_type="translation",
            task_name=f"Translation {source_lang}-{target_lang}",
            dataset_type=dataset_id or dataset_name,
            dataset_name=dataset_name,
            dataset_split=row["split"],
            metric_type=metric,
            metric_name=metric.upper() if metric == "bleu" else "chrF",
            metric_value=round(float(row[metric]), 2),
        )
        for row in results
        for metric in ("bleu", "chrf")
    ]
    card_data = ModelCardData(
        model_name=model_id,
        language=[source_lang, target_lang],
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", "mgsa-hf", config.encoder_type, "syntax-aware"],
        datasets=[dataset_id] if dataset_id else None,
        metrics=["bleu", "chrf"],
        eval_results=eval_results or None,
    )
    if parser is None:
        processor_summary = "the tokenizer alone: this model reads no syntax"
        requirements = "`transformers` and `torch` are all it needs"
    else:
        processor_summary = f"tokenizer + spaCy parser, `{parser}`"
        processor_summary += f"; constituency trees {tree_source}" if tree_source else ""
        if parser in DEFAULT_PARSERS:  # the processor loads whichever of them is installed
            requirements = ("the parse needs spaCy and its English pipeline `en_core_web_sm` (`pip install spacy`, "
                            "`python -m spacy download en_core_web_sm`)")
        else:
            requirements = f"the parse needs spaCy and the pipeline `{parser}`"
    if generation_config is None:
        from transformers import GenerationConfig

        generation_config = GenerationConfig.from_model_config(config)
    decoding = f"beam {generation_config.num_beams or 1}"
    if generation_config.max_length:
        decoding += f", at most {generation_config.max_length} tokens"
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        model_id=model_id,
        source_lang=source_lang,
        target_lang=target_lang,
        backbone=BACKBONE_NAMES[config.backbone],
        encoder_type=config.encoder_type,
        method_summary=summary,
        paper=paper,
        parser=processor_summary,
        requirements=requirements,
        decoding=decoding,
        dataset_name=f"[{dataset_name}](https://huggingface.co/datasets/{dataset_id})" if dataset_id else dataset_name,
        train_size=train_size,
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        heads=config.encoder_attention_heads,
        vocab_size=config.vocab_size,
        variant_settings=json.dumps(variant_settings(config)),
        hyperparameters=", ".join(f"{key}={value}" for key, value in hyperparameters.items()),
        results=results,
        bleu_signature=results[0].get("bleu_signature", "") if results else "",
        example_source=example_source,
    )


def describe_tree_source(tree_parser: str | None, given_trees: bool = False) -> str:
    """Where a processor's constituency trees come from, for the model card."""
    if tree_parser is None:
        source = ("derived from the dependency parse by the conversion learned from Penn Treebank trees "
                  "(`constituency_conversion.json.gz` in this folder)")
    elif tree_parser == "rules":
        source = "derived from the dependency parse by hand-written rules"
    else:
        source = f"from the parser plug-in `{tree_parser}`"
    return source + ("; given trees where the training data had them" if given_trees else "")
