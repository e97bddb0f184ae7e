"""The training config: a recipe (YAML/JSON, see [`~mgsa_hf.training.catalogue`]) with `section.key=value` overrides,
read into [`TrainConfig`] and checked before any work (the `model` section as the configuration class checks itself,
the `training` section as `Seq2SeqTrainingArguments`' own parser reads it, the folders it names)."""

import argparse
import dataclasses
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .catalogue import (
    DEFAULT_RECIPE,
    FINETUNE_RECIPE,
    RECIPES,
    default_data,
    expand_rows,
    looks_local,
    missing_data_message,
    override_key,
    recipe_path,
)
from .ownership import run_folder
from .recipe_values import check_generation_section, check_recipe_values, check_training_ranges


logger = logging.getLogger(__name__)


DEFAULT_CONFIG = RECIPES / f"{DEFAULT_RECIPE}.yaml"


@dataclass
class TrainConfig:
    """
    Everything one training run needs. Unknown keys are errors. `data`: a folder of `{split}.{lang}[.gz]`,
    `{split}.jsonl` or Arrow files, a JSONL file or a Hub dataset id; by default Multi30k at `$MGSA_HF_DATA/multi30k`,
    else `../shared/data/multi30k` ([`~catalogue.default_data`]). `model`, `processor` and `training` hold the fields
    of the backbone's configuration (`MgsaConfig` for `backbone: marian`, `MgsaT5Config` for `backbone: t5`),
    `MgsaProcessor` and `Seq2SeqTrainingArguments` and are checked against them before any work starts.

    Trees of the source sentences replace the processor's own (MG-SA's phrases and tags, PR's parse phrases and RHE's
    local phrases then come from them): `trees` maps a split (`train`, `validation`, `test`) to a file of PTB
    bracketed trees, one line per source sentence of that split as the corpus holds it (before
    `max_*_samples`), an empty line where the processor's own tree is used; or `tree_column` names the field of the
    JSONL records (or the column of the Hub dataset) that holds them. A plug-in parser for every sentence is a
    `processor` setting instead (`processor: {tree_parser: "package.module:function"}`).

    `generation`: fields of transformers' `GenerationConfig` (`no_repeat_ngram_size`, `length_penalty`, ...) written
    into the model's generation config, so the run scores with them and the saved folder decodes with them; the beam
    size and length bound are `training.generation_num_beams` and `training.generation_max_length`.

    The model is initialised after seeding with `training.seed` (as the Trainer seeds the data order and dropout), so
    a run repeats the same numbers on the same machine and thread count (the joint vocabulary's training is
    deterministic too, [`~mgsa_hf.tokenization_utils.train_joint_tokenizer`]).
    `reuse_cpu_memory` (training on CPU, Linux with glibc): freed memory stays in the process for the next step's
    tensors instead of being handed back to the system and faulted in again ([`reuse_freed_cpu_memory`]); it holds
    the run's peak memory for the rest of the process. `max_tokens_per_batch`: training batches of at most that many
    padded tokens per side and process, in random order ([`TokenBatchSampler`]), instead of
    `training.per_device_train_batch_size` sentences.
    `threads`: torch's CPU threads in each training process (`torch.set_num_threads`, applied before the model is
    built; unset: torch's default, one per core). On a machine whose cores are busy with other work, 1 is often much
    faster than the default ([`apply_threads`]).
    `tokens_per_update`: the tokens per side of one optimizer update, from which `training.gradient_accumulation_steps`
    follows for the run's number of processes ([`gradient_accumulation_for_tokens`]); it needs `max_tokens_per_batch`.

    `init_from`: an MGSA, Marian or T5 folder to fine-tune. The model keeps that checkpoint's configuration, and only
    the `model` keys set explicitly change it: `model.key=value` overrides, and the `model` section of a config file
    that itself names `init_from` (the `finetune` recipe, which `init_from` without a recipe picks); the `model`
    section of a recipe written to train from scratch (`recipe=tiny`) does not apply over a checkpoint given as an
    override. The checkpoint's tokenizer (unless `tokenizer` names another) and its saved processor settings (under
    the `processor` section's) come with it; saved settings that name code (a `tree_parser` import path,
    `parser_code`) only with `trust_remote_code: true`. `init_new_modules`: how modules the checkpoint lacks (a
    variant added by `model.encoder_type=...`) start: `"identity"` (the model computes what the checkpoint
    computed, as far as the variant allows, see [`~modeling_upgrade.init_new_modules_as_identity`]) or `"random"`.

    `resume_from_checkpoint`: true (the newest complete checkpoint in the run folder's `checkpoints/`; an error when
    there is none) or a checkpoint folder, which must hold what resuming reads and belong to this run: the same model
    settings, vocabulary and training data ([`MgsaSeq2SeqTrainer.train`]).
    `average_last_checkpoints`: N >= 0, the last N of the run's own checkpoints averaged when that scores at least as
    well (0: none). A run holds its folders' lock (`run.lock` in the run folder) to its end, and starts only where no
    other run left a model or run files, unless it resumes that run or `overwrite_output_dir: true` (transformers 5
    has no such training argument) removes them first ([`own_run_folders`]).

    `collapse_check_step`: at this step the spread of the encoder's output states over the tokens of 100 validation
    sentences is measured ([`EncoderCollapseCallback`]); under `collapse_min_spread` the run has become a target-side
    language model whose encoder sends every token out as one vector, and it starts again from a new initialisation
    with the next seed, at most `collapse_restarts` times (the last attempt is not checked). None: no check.

    The corpus is prepared once, on disk ([`~mgsa_hf.training.corpus`]): its splits, then their tokens and syntax
    fields, in folders under `prepared_dir` (default: the run folder's `prepared/`) named by what decides their
    content, which every process, resumed run and later launch loads memory-mapped; `num_proc` worker processes
    parse it (default: one); the joint vocabulary is trained on at most `tokenizer_max_sentences` pairs, drawn
    evenly from the training split (null: all). `clean_min_words`, `clean_max_words`, `clean_max_ratio`: the training
    pairs kept, as Moses' `clean-corpus-n.perl` keeps them (fairseq's WMT14 preparation: 1, 250, 1.5): both sides of
    `clean_min_words`..`clean_max_words` whitespace-separated words, and neither side more than `clean_max_ratio`
    times as many words as the other (null: no such filter); the dropped counts are in the corpus step's
    `prepared.json` and the run's `results.json`. `prepare_in_shards: true`: under `accelerate launch` every process
    tokenizes and parses its share of the corpus into `prepared_dir`, which every machine must then share
    ([`~mgsa_hf.training.shards`]); by default rank 0 prepares it alone while the others wait.
    """

    data: str = field(default_factory=default_data)
    source_lang: str = "en"
    target_lang: str = "de"
    splits: dict = field(default_factory=lambda: {"train": "train", "validation": "val", "test": "test_2016_flickr"})
    hub_config: str | None = None
    trees: dict = field(default_factory=dict)
    tree_column: str | None = None
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    max_test_samples: int | None = None
    tokenizer: str | None = None
    vocab_size: int = 8000
    init_from: str | None = None
    init_new_modules: str = "identity"
    trust_remote_code: bool = False
    backbone: str = "marian"
    model: dict = field(default_factory=dict)
    processor: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)
    generation: dict = field(default_factory=dict)
    max_source_length: int = 128
    max_target_length: int = 128
    average_last_checkpoints: int = 0
    resume_from_checkpoint: str | bool | None = None
    overwrite_output_dir: bool = False
    output_dir: str = "runs/mgsa-multi30k"
    examples: list = field(default_factory=list)
    reuse_cpu_memory: bool = True
    max_tokens_per_batch: int | None = None
    threads: int | None = None
    tokens_per_update: int | None = None
    collapse_check_step: int | None = None
    collapse_min_spread: float = 0.5
    collapse_restarts: int = 2
    prepared_dir: str | None = None
    num_proc: int | None = None
    tokenizer_max_sentences: int | None = 1_000_000
    clean_min_words: int | None = None
    clean_max_words: int | None = None
    clean_max_ratio: float | None = None
    prepare_in_shards: bool = False


class _Yaml12Loader(yaml.SafeLoader):
    """YAML with the 1.2 core schema's booleans and floats: only true/false are booleans, and `1e-3` is a float.
    PyYAML follows YAML 1.1, where `no`, `off`, `y` are booleans too, which turns `training.eval_strategy=no` into
    False (OmegaConf resolves them the same way), and where a float needs a dot."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _first in "tTfF":
    _Yaml12Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), [_first]
    )
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def _load_yaml(text: str):
    return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 (a SafeLoader subclass)


def read_recipe(path: Path):
    """The YAML (or JSON) content of the recipe file `path`.

    Raises:
        ValueError: naming the file and the line (and column) where it stops being UTF-8 text or YAML (a binary
            file, a bracket left open, ...), raised from the YAML reader's error.
    """
    data = path.read_bytes()
    try:
        return yaml.load(data, Loader=_Yaml12Loader)  # noqa: S506 (a SafeLoader subclass); bytes: it checks UTF-8
    except yaml.reader.ReaderError as error:  # not UTF-8 (a byte position), or a control character (a character's)
        text = data if error.encoding != "unicode" else data.decode("utf-8")
        line = text.count(b"\n" if isinstance(text, bytes) else "\n", 0, error.position) + 1
        character = f"byte {error.character:#04x}" if error.encoding != "unicode" else f"U+{error.character:04X}"
        raise ValueError(f"training config {path}, line {line}: not a YAML or JSON text file ({character}: "
                         f"{error.reason}).") from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or error
        raise ValueError(f"training config {path}{where}: not valid YAML ({problem}).") from error


def _parse_value(text: str):
    try:
        return _load_yaml(text)
    except yaml.YAMLError:
        return text


def _apply_override(raw: dict, override: str) -> None:
    key, sep, value = override.partition("=")
    if not sep:
        raise ValueError(f"override {override!r} must look like key=value or section.key=value.")
    *sections, name = key.strip().split(".")
    target = raw
    for section in sections:
        target = target.setdefault(section, {})
        if not isinstance(target, dict):
            raise ValueError(f"override {override!r}: {section!r} is not a section.")
    target[name] = _parse_value(value)


def load_train_config(path: str | Path | None = None, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML/JSON training config and apply `key=value` overrides.

    `path` is a file or a packaged recipe's name (`finetune`); None: the recipe an override `recipe=NAME` names, else
    `finetune` when an override sets `init_from` (a checkpoint is fine-tuned with the fine-tuning recipe, never with
    the from-scratch recipe's learning rate and warm-up), else `default`. An override `model=<encoder_type>/<row>`
    sets the model fields of a packaged row (or of a JSON file), which later `model.*` overrides change.
    """
    overrides = list(overrides)
    named = [override.partition("=")[2].strip() for override in overrides if override_key(override) == "recipe"]
    overrides = expand_rows([override for override in overrides if override_key(override) != "recipe"])
    if named and (path is not None or len(named) > 1):
        raise ValueError(f"name one recipe: {path or named[0]!r} and recipe={named[-1]!r} were both given.")
    if named:
        path = named[0]
    elif path is None:
        path = FINETUNE_RECIPE if any(override_key(o) == "init_from" for o in overrides) else DEFAULT_RECIPE
        if path == FINETUNE_RECIPE:
            logger.info("init_from without a recipe: the %s recipe (%s)", FINETUNE_RECIPE, RECIPES)
    path = recipe_path(path)
    raw = read_recipe(path)
    if raw is None:  # an empty file (or comments only): a recipe cut short, never "train with every default"
        raise ValueError(f"training config {path} is empty: it names no key. Give the recipe's keys, or name a "
                         "packaged recipe (recipe=default).")
    if not isinstance(raw, dict):
        raise ValueError(f"training config {path} must be a mapping of keys to values.")
    # a file that does not name `init_from` describes a model to train from scratch: with `init_from` given as an
    # override, the checkpoint's own configuration stands and only the model keys given as overrides change it
    recipe_for_scratch = not raw.get("init_from")
    for override in overrides:
        _apply_override(raw, override)
    if raw.get("init_from") and recipe_for_scratch and isinstance(raw.get("model"), dict):
        explicit = {override.partition("=")[0].strip() for override in overrides}
        dropped = sorted(key for key in raw["model"] if f"model.{key}" not in explicit)
        if dropped:
            logger.info("init_from=%s keeps its own configuration: the model keys %s of %s do not apply.",
                        raw["init_from"], dropped, path)
        raw["model"] = {key: value for key, value in raw["model"].items() if f"model.{key}" in explicit}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown training config key(s) {unknown} in {path}; allowed: {sorted(known)}.")
    config = TrainConfig(**raw)
    check_recipe_values(config)  # every key's type and range, named (`recipe_values`)
    config.training = check_training_ranges(_typed_training_values(config.training))
    trained_vocabulary = None if config.tokenizer or config.init_from else config.vocab_size  # the run trains it
    check_generation_section(config.generation, config.training.get("generation_num_beams"), trained_vocabulary)
    return config


def _typed_training_values(section: dict) -> dict:
    """
    The `training` section's values read as `Seq2SeqTrainingArguments`' own command-line parser reads them
    (`HfArgumentParser`: each field's type and choices), so that `max_steps: abc` fails here, naming the key, and not
    deep inside the Trainer (which takes any value and compares it later). Strings are converted as that parser
    converts them (`"7"` → 7, `"yes"` → True); fields of other types (text, lists, mappings) pass as they are.
    """
    from argparse import ArgumentTypeError

    from transformers import HfArgumentParser, Seq2SeqTrainingArguments
    from transformers.hf_argparser import string_to_bool

    # a boolean field has a second action, `--no_<field>`, without a type
    actions = {action.dest: action for action in HfArgumentParser(Seq2SeqTrainingArguments)._actions
               if action.type is not None}
    kinds = {int: "a whole number", float: "a number", string_to_bool: "true or false"}
    typed = {}
    for key, value in section.items():
        action = actions.get(key)
        typed[key] = value
        if action is None or value is None:
            continue
        if action.type in kinds:
            if isinstance(value, str):
                try:
                    typed[key] = action.type(value.strip())
                    fits = True
                except (ValueError, ArgumentTypeError):
                    fits = False
            elif action.type is string_to_bool:
                fits = isinstance(value, bool)
            else:
                fits = isinstance(value, int if action.type is int else (int, float)) and not isinstance(value, bool)
            if not fits:
                raise ValueError(f"`training.{key}` must be {kinds[action.type]} (Seq2SeqTrainingArguments.{key}), "
                                 f"got {value!r}.")
        elif action.choices and getattr(value, "value", value) not in action.choices:
            raise ValueError(f"`training.{key}` must be one of {list(action.choices)} "
                             f"(Seq2SeqTrainingArguments.{key}), got {value!r}.")
    return typed


def _check_run_settings(config: TrainConfig) -> None:
    """The settings that would otherwise fail deep inside a library, or do the wrong thing without a word, checked
    before any work: an `output_dir` that is a file, `threads`, the `tokenizer` and `init_from` folders,
    `average_last_checkpoints`, `resume_from_checkpoint`, and last a local `data` folder or file that does not
    exist."""
    from .conversion import check_folder_or_hub_id, saved_processor_settings
    from .trainer import checkpoint_folders

    for folder, key in ((Path(config.output_dir), "output_dir"), (run_folder(config.output_dir), "its run folder")):
        if folder.exists() and not folder.is_dir():  # else it failed saving the model, once training was done
            raise FileExistsError(f"{key} {folder} is a file, not a folder: name a folder for the run.")
    threads = config.threads
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"`threads` must be a whole number >= 1 (torch's CPU threads per process) or null (torch's "
                         f"default), got {threads!r}.")
    for key in ("tokenizer", "init_from"):
        value = getattr(config, key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"`{key}` must be a folder or a Hub id, got {value!r}.")
        if value:
            check_folder_or_hub_id(value, key)
    if not isinstance(config.trust_remote_code, bool):
        raise ValueError(f"`trust_remote_code` must be true or false, got {config.trust_remote_code!r}.")
    saved_processor_settings(config.init_from, config.processor, config.trust_remote_code, "trust_remote_code=true")
    average = config.average_last_checkpoints
    if isinstance(average, bool) or not isinstance(average, int) or average < 0:
        raise ValueError(f"`average_last_checkpoints` must be a whole number >= 0 (the last N checkpoints; 0: no "
                         f"averaging), got {average!r}.")
    resume = config.resume_from_checkpoint
    if resume is True:
        folder = run_folder(config.output_dir) / "checkpoints"
        if not checkpoint_folders(folder):
            raise FileNotFoundError(f"resume_from_checkpoint=true: there is no checkpoint (checkpoint-<step> folder) "
                                    f"in {folder} to resume from; leave it out to start the run.")
    elif isinstance(resume, str) and resume:
        if not Path(resume).is_dir():
            raise FileNotFoundError(f"resume_from_checkpoint={resume!r}: no such checkpoint folder.")
    elif resume not in (None, False):
        raise ValueError(f"`resume_from_checkpoint` must be true, false or a checkpoint folder, got {resume!r}.")
    if not isinstance(config.data, str) or not config.data:
        raise ValueError(f"`data` must be a folder, a file or a Hub dataset id, got {config.data!r}.")
    if looks_local(config.data) and not Path(config.data).exists():
        raise FileNotFoundError(missing_data_message(config.data))


def gradient_accumulation_for_tokens(config: TrainConfig, world_size: int) -> int | None:
    """
    The `gradient_accumulation_steps` that gives each update `tokens_per_update` tokens (per side) or a few more:
    ⌈tokens_per_update / (max_tokens_per_batch × world_size)⌉, as fairseq's `--update-freq` is chosen for its
    `--max-tokens` on a number of GPUs. None without `tokens_per_update`. An error when it is not a positive whole
    number, without token batches (`max_tokens_per_batch`), or when `training.gradient_accumulation_steps` is set to
    another value.
    """
    tokens = config.tokens_per_update
    if tokens is None:
        return None
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"`tokens_per_update` must be a positive whole number of tokens, got {tokens!r}.")
    if not config.max_tokens_per_batch:
        raise ValueError(f"`tokens_per_update={tokens}` counts token batches: set `max_tokens_per_batch` too (the "
                         "tokens of one process's batch), or leave `tokens_per_update` unset for sentence batches.")
    if isinstance(config.max_tokens_per_batch, bool) or not isinstance(config.max_tokens_per_batch, int) \
            or config.max_tokens_per_batch < 1:
        raise ValueError(f"`max_tokens_per_batch` must be a positive number of tokens, got "
                         f"{config.max_tokens_per_batch!r}.")
    steps = math.ceil(tokens / (config.max_tokens_per_batch * world_size))
    given = config.training.get("gradient_accumulation_steps")
    if given is not None and given != steps:
        raise ValueError(f"`tokens_per_update={tokens}` with `max_tokens_per_batch={config.max_tokens_per_batch}` on "
                         f"{world_size} process(es) means `training.gradient_accumulation_steps={steps}`, but "
                         f"`training.gradient_accumulation_steps={given}` is set: leave out one of the two.")
    return steps


def apply_threads(config: TrainConfig) -> None:
    """Set torch's CPU threads for this process to `config.threads` (`torch.set_num_threads`); unset: leave torch's
    default."""
    if config.threads is not None:
        import torch

        torch.set_num_threads(config.threads)


def _backbone_classes(config: TrainConfig):
    """The (configuration, model) classes of `config.backbone`."""
    from .conversion import BACKBONES

    if config.backbone not in BACKBONES:
        raise ValueError(f"`backbone` must be one of {sorted(BACKBONES)}, got {config.backbone!r}.")
    return BACKBONES[config.backbone]


def _model_config_fields(config: TrainConfig, tokenizer) -> dict:
    """Model configuration fields: the config's `model` section plus the tokenizer's vocabulary and special tokens."""
    fields = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "decoder_start_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "forced_eos_token_id": tokenizer.eos_token_id,
    }
    if config.backbone == "marian":  # T5's positions are relative
        fields["max_position_embeddings"] = max(config.max_source_length, config.max_target_length, 256)
    return {**fields, **config.model}


def source_position_limit(config: TrainConfig) -> int | None:
    """The most source tokens the model to train reads: a Marian backbone's `max_position_embeddings` (the recipe's,
    or `init_from`'s); None for T5, whose positions are relative."""
    from .conversion import checkpoint_backbone

    if config.init_from:
        if checkpoint_backbone(config.init_from) == "t5":
            return None
        return config.model.get("max_position_embeddings", _init_from_config(config).get("max_position_embeddings"))
    if config.backbone != "marian":
        return None
    return config.model.get("max_position_embeddings",
                            max(config.max_source_length, config.max_target_length, 256))


def _init_from_config(config: TrainConfig) -> dict:
    """The `config.json` of `init_from` (a folder or Hub id), or an error saying it has none."""
    from transformers import PretrainedConfig

    try:
        return PretrainedConfig.get_config_dict(config.init_from)[0]
    except OSError as error:
        raise ValueError(f"init_from={config.init_from!r} is not a model folder (or Hub id) with a config.json: "
                         f"{error}") from None


def _check_init_from(config: TrainConfig, tokenizer) -> None:
    """`init_from` must be a folder (or Hub id) with a config, and the tokenizer must fit its embeddings."""
    checkpoint = _init_from_config(config)
    vocab_size = config.model.get("vocab_size", checkpoint.get("vocab_size"))
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but init_from={config.init_from!r} embeds {vocab_size}: "
            "fine-tune with the checkpoint's own tokenizer (leave `tokenizer` unset, it is loaded from init_from) or "
            "one that fits it."
        )


def validate_model_section(config: TrainConfig) -> None:
    """
    Check the `model` section before any work, as the configuration class checks itself: names that are no field
    (with the nearest field), types, ranges and the relations between fields (layer indices within the encoder,
    heads that add up). With `init_from`, the checkpoint's configuration with the section's keys over it is checked,
    the configuration the run will train.
    """
    trained_model_config(config)


def trained_model_config(config: TrainConfig):
    """The model configuration the run trains, checked (see [`validate_model_section`]): the `model` section over the
    backbone's defaults, or over the configuration of the checkpoint `init_from` names."""
    from .conversion import BACKBONES, checkpoint_backbone

    if not config.init_from:
        config_class = _backbone_classes(config)[0]
        config_class.reject_unknown_fields(config.model)
        return config_class(**config.model)
    _init_from_config(config)  # a clear error where there is none
    config_class = BACKBONES[checkpoint_backbone(config.init_from)][0]
    config_class.reject_unknown_fields(config.model)
    return config_class.from_pretrained(config.init_from, **config.model)


def source_syntax_fields(config: TrainConfig) -> tuple[str, ...]:
    """The processor's syntax fields that the model to train reads (its variant's `syntax_fields`: none for the
    transformer, hybrid attention or n-gram MG-SA) and that its loss reads (MG-SA's `phrase_tags`): what a prepared
    corpus stores."""
    from ..syntax_fields import check_syntax_field_names

    model_config = trained_model_config(config)
    fields = model_config.source_syntax_fields
    if getattr(model_config, "trains_tag_loss", False):
        fields += ("phrase_tags",)
    return check_syntax_field_names(fields)


def _reads_source_syntax(config: TrainConfig) -> bool:
    """Whether the model to train reads any of the processor's syntax fields (see `MgsaConfig.reads_source_syntax`)."""
    return bool(source_syntax_fields(config))


def add_train_arguments(parser) -> None:
    """The arguments of `mgsa-hf train` and `finetune`: a recipe or config file and `KEY=VALUE` overrides."""
    parser.add_argument("config", nargs="?", default=None,
                        help="a packaged recipe's name or a YAML/JSON training config file (default: recipe=default, "
                             "or recipe=finetune when init_from= is given)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="overrides such as model.encoder_type=rhe training.max_steps=2000 output_dir=runs/rhe")


def positive_int(text: str) -> int:
    """argparse type of a count of at least 1 (the scripts' batch sizes, beams, lengths, jobs and threads)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value
