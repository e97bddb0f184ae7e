"""Model cards for trained MGSA models: the variant, its paper, the data, the hyperparameters and measured scores."""

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..modeling_common import PLACEHOLDER_NOTE, REPO_ID_PLACEHOLDER
from ..syntax_spacy import DEFAULT_PARSERS


TEMPLATE = Path(__file__).with_name("model_card_template.md")
# the spaCy releases the package runs with (setup.cfg), as a card's install line names them
SPACY_REQUIREMENT = "'spacy>=3.8.15,<3.9'"


@dataclasses.dataclass(frozen=True)
class CardDataset:
    """How a card names a corpus: its Hub dataset `id` (None where there is none), its `name`, and the Hub's name of
    each of the corpus's own split names that the card reports (`splits`; a corpus without a Hub id keeps its own)."""

    id: str | None
    name: str
    splits: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def split_name(self, split: str) -> str:
        """The dataset's own name of the run's `split` (the Hub's `validation` for a local `val` file)."""
        return self.splits.get(split, split)


# (corpus folder name, language pair) -> the Hub dataset that a local copy of a published corpus is: its id, the
# card's name for it, and the Hub's split of each of the copy's split files (bentrevett/multi30k: train 29,000,
# validation 1,014, test 1,000 pairs, the files train, val and test_2016_flickr of the WMT16 task 1 release). A local
# copy that is trained or scored on other splits, and every other local corpus, is named by its folder with no id.
HUB_DATASETS = {
    ("multi30k", frozenset({"en", "de"})): CardDataset(
        "bentrevett/multi30k", "Multi30k (task 1, en-de)",
        {"train": "train", "val": "validation", "test_2016_flickr": "test"},
    ),
}

# config.backbone -> how the card names the architecture
BACKBONE_NAMES = {"marian": "Marian-style", "t5": "T5-style"}

# what a card says about a corpus it knows (matched by name in the dataset's id or name): its domain and its terms
MULTI30K_DOMAIN = (
    "Multi30k's image captions: short sentences (13 words on average) that describe people, animals and scenes in "
    "photographs. It translates sentences of that kind and does much worse on anything else (news, dialogue, "
    "technical text, long sentences); the scores below are on captions of the same kind."
)
MULTI30K_TERMS = (
    "Multi30k (task 1, en-de; Elliott et al., 2016, <https://github.com/multi30k/dataset>) publishes no licence: "
    "neither its repository nor the Hub copy `bentrevett/multi30k` states one. It is distributed for research, and "
    "its English sentences are Flickr30K captions (Young et al., 2014), which come under Flickr30K's own terms. "
    "Check the dataset's terms before using this model for anything but research."
)
# spaCy's parse and the trees per source sentence on one CPU core (en_core_web_sm, benchmarks/BENCHMARKS.md)
PARSE_COST = (
    "every source sentence is parsed with spaCy before it is translated: about 0.7 ms a sentence on one CPU core "
    "with `en_core_web_sm` (1,400 sentences/s, trees included), little next to beam search, but it needs spaCy and an "
    "English pipeline, so the source must be English. The parse's mistakes reach the translation: the trees score "
    "0.87 F1 against Penn Treebank's news trees, and less on text unlike the parser's training data"
)

def variant_settings(config) -> dict:
    """The config fields that define the encoder variant (its `config_fields`)."""
    fields = config.variant.config_fields
    names = {field.name for field in dataclasses.fields(fields)} if fields else set()
    return {key: value for key, value in config.to_dict().items() if key in names}


def card_dataset(data: str | Path, source_lang: str, target_lang: str, splits: Iterable[str] = ()) -> CardDataset:
    """
    How a card names the corpus `data` (a training config's `data`) and its `splits` (the corpus's own names of the
    splits trained on and scored, the config's `splits` values): a Hub dataset id names itself and its splits; a local
    copy of a corpus published on the Hub, recognised by its folder name and language pair ([`HUB_DATASETS`]:
    `multi30k` en-de is `bentrevett/multi30k`), gets that id and the Hub's split names, if every one of `splits` is a
    split of the Hub's; any other folder or file is named by its name alone, with no id.
    """
    text = str(data)
    path = Path(text)
    if not path.exists() and path.suffix != ".jsonl" and not text.startswith((".", "/")):
        return CardDataset(text, text)  # read with `datasets.load_dataset`: a Hub id, its own split names
    name = path.stem if path.suffix == ".jsonl" else path.name
    known = HUB_DATASETS.get((name.lower(), frozenset({source_lang, target_lang})))
    if known is None or not set(splits) <= set(known.splits):
        return CardDataset(None, name)
    return known


def card_repo_id(repo_id: str | None, folder_name: str) -> str:
    """The repository id a card's code loads: the one the folder is pushed to, else a placeholder
    (`<your-username>/<folder name>`) that the card asks to replace and `push_to_hub` replaces."""
    return repo_id or f"{REPO_ID_PLACEHOLDER}{folder_name}"


def card_base_model(init_from: str | None) -> str | None:
    """The Hub id of the checkpoint a model was fine-tuned from (`init_from`): a Hub id, or the id of a Hub download
    in the cache (`.../models--<namespace>--<name>/snapshots/<commit>`); None for a local folder or none."""
    if not init_from:
        return None
    cached = re.search(r"models--([^/\\]+?)--([^/\\]+)[/\\]snapshots[/\\]", str(init_from))
    if cached:
        return f"{cached.group(1)}/{cached.group(2)}"
    if Path(init_from).exists() or str(init_from).startswith((".", "/", "~")):
        return None
    return str(init_from)


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
    title: str | None = None,
    init_from: str | None = None,
    slow_tokenizer: bool = False,
    num_parameters: int | None = None,
) -> ModelCard:
    """
    Fill the card template.

    `results` is a list of `{"split": ..., "bleu": ..., "chrf": ..., "bleu_signature": ...}`, `split` the dataset's
    name for it (the Hub's `test`, see [`CardDataset.split_name`]) and, where it differs, `corpus_split` the corpus's
    own (`test_2016_flickr`), which the card's table shows; each score goes into the card's `model-index` as an
    evaluation result on the dataset `dataset_id` (its Hub id, see [`card_dataset`]; `dataset_name` where there is
    none) and split `split`, and the metadata lists the dataset under `datasets`. `num_parameters`: the model's
    parameter count, which the card states. `tree_source` says where the constituency trees come from (see
    [`describe_tree_source`]); `generation_config` (the model's) gives the decoding settings the card states.

    `model_id` is the repository id the card's code loads (see [`card_repo_id`]; a placeholder gets a note asking
    to replace it), `title` the card's heading (by default `model_id`); `init_from`, the checkpoint fine-tuned from,
    becomes `base_model` where it is on the Hub ([`card_base_model`]); `slow_tokenizer` says the processor's
    tokenizer is a SentencePiece one (Marian's), which needs `sentencepiece`.
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
    # "syntax-aware" only for a model that reads the parse (not the transformer, hybrid attention or n-gram MG-SA)
    syntax_tag = ["syntax-aware"] if config.reads_source_syntax else []
    card_data = ModelCardData(
        model_name=model_id,
        language=[source_lang, target_lang],
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", "mgsa-hf", config.encoder_type, *syntax_tag],
        datasets=[dataset_id] if dataset_id else None,
        metrics=["bleu", "chrf"],
        eval_results=eval_results or None,
        base_model=card_base_model(init_from),
    )
    packages = ["torch", "transformers", *(["sentencepiece"] if slow_tokenizer else [])]
    if parser is None:
        processor_summary = "the tokenizer alone: this model reads no syntax"
        if slow_tokenizer:
            requirements = "`transformers`, `torch` and `sentencepiece` (its tokenizer) are all it needs"
        else:
            requirements = "`transformers` and `torch` are all it needs"
    else:
        processor_summary = f"tokenizer + spaCy parser, `{parser}`"
        processor_summary += f"; constituency trees {tree_source}" if tree_source else ""
        packages.append(SPACY_REQUIREMENT)
        if parser in DEFAULT_PARSERS:  # the processor loads whichever of them is installed
            requirements = (f"the parse needs spaCy and its English pipeline `en_core_web_sm` (`pip install "
                            f"{SPACY_REQUIREMENT}`, `python -m spacy download en_core_web_sm`)")
        else:
            requirements = f"the parse needs spaCy and the pipeline `{parser}`"
    base_model = card_base_model(init_from)
    if base_model:
        fine_tuned = f"Fine-tuned from [`{base_model}`](https://huggingface.co/{base_model})."
    elif init_from:
        fine_tuned = (f"Fine-tuned from the local checkpoint `{Path(str(init_from)).name}`: where it is on the Hub, "
                      "name it as `base_model` in the metadata above.")
    else:
        fine_tuned = "Trained from scratch."
    corpus = f"{dataset_id or ''} {dataset_name}".lower()
    if "multi30k" in corpus:
        domain, terms = MULTI30K_DOMAIN, MULTI30K_TERMS
    else:
        domain = (f"{train_size:,} sentence pairs of {dataset_name}. It translates text like them and does much worse "
                  "on other text.")
        terms = f"Check the licence and terms of {dataset_name} before using or sharing this model."
    if generation_config is None:
        from transformers import GenerationConfig

        generation_config = GenerationConfig.from_model_config(config)
    decoding = f"beam {generation_config.num_beams or 1}"
    if generation_config.max_length:
        decoding += f", at most {generation_config.max_length} tokens"
    guard = generation_config.no_repeat_ngram_size
    if guard:
        decoding += f", `no_repeat_ngram_size={guard}`"
        loop_guard = (f"The saved generation config sets `no_repeat_ngram_size={guard}`: `generate` never writes the "
                      f"same {guard} subwords twice in a sentence, which cuts such loops short, and also a sentence "
                      "that repeats them on purpose (pass `no_repeat_ngram_size=0` to allow it).")
    else:
        loop_guard = ("`generate(..., no_repeat_ngram_size=4)` cuts such loops short, at the cost of the rare "
                      "sentence that repeats four subwords on purpose.")
    looped = [row for row in results if row.get("loop_fraction") is not None]
    loops = ", ".join(f"{100 * row['loop_fraction']:.1f}% of `{row.get('corpus_split') or row['split']}`'s "
                      "translations" for row in looped)
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        model_id=model_id,
        title=title or model_id,
        placeholder_note=model_id.startswith(REPO_ID_PLACEHOLDER),
        note_markers=PLACEHOLDER_NOTE,
        install=" ".join(packages),
        fine_tuned=fine_tuned,
        paper_url=config.variant.paper_url,
        source_lang=source_lang,
        target_lang=target_lang,
        backbone=BACKBONE_NAMES[config.backbone],
        encoder_type=config.encoder_type,
        method_summary=summary,
        paper=paper,
        parser=processor_summary,
        requirements=requirements,
        decoding=decoding,
        loops=loops,
        loop_guard=loop_guard,
        dataset_name=f"[{dataset_name}](https://huggingface.co/datasets/{dataset_id})" if dataset_id else dataset_name,
        train_size=f"{train_size:,}",
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        heads=config.encoder_attention_heads,
        vocab_size=config.vocab_size,
        variant_settings=json.dumps(variant_settings(config)),
        hyperparameters=", ".join(f"{key}={value}" for key, value in hyperparameters.items()),
        num_parameters=f"{num_parameters:,}" if num_parameters else None,
        domain=domain,
        data_terms=terms,
        parse_cost=PARSE_COST if parser is not None else None,
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
