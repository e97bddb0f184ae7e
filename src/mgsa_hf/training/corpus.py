"""A training corpus prepared once, on disk, for every process of a run and every later launch.

Preparing a corpus is three steps, each written to its own folder under `prepared_dir` (by default the run folder's
`prepared/`) and named by a key of everything that decides its content:

1. `corpus-<key>`: the corpus's splits as Arrow files (`datasets`' `save_to_disk`), read from a folder of text files
   in batches (the text is never held in memory whole), from a JSONL file or from the Hub. The key covers the source
   (each local file's name in its folder and the hash of its bytes, [`file_identity`]; a Hub id and configuration),
   the splits, languages, sample limits and tree files: the same corpus copied to another path or machine has the
   same key, and a file changed in place (even with its size and modification time restored) a new one.
2. `parsed-<key>`, for a model that reads syntax: spaCy's parse of every source sentence (word spans, heads and
   constituency tree, [`~mgsa_hf.processing_mgsa.MgsaProcessor.parse`]), made by `num_proc` worker processes (each
   with its own spaCy pipeline). The key adds the parser's identity alone (`parse_fingerprint`: its settings, the
   pipeline's and spaCy's versions, the parse code), not the tokenizer: another vocabulary or field setting reuses it.
3. `processed-<key>`: the tokenized splits with the model's fields (derived from the parses, without spaCy), in the
   narrowest integer types that hold them ([`FIELD_TYPES`], checked as written), without the all-ones attention
   mask, written straight into the folder. The key adds the processor's fingerprint (its settings, its tokenizer,
   the parser and this package's code) and the length limits.

A folder is written beside its final name and renamed into place when complete, with `prepared.json` in it, so it
is whole or absent. The record holds each file's size and SHA-256, which every load checks
([`~mgsa_hf.training.file_records`]): a file cut short or damaged since is refused by name. A second launch, a
resume and every other process load it memory-mapped in seconds. Under `accelerate launch` only the main process of
the whole run (rank 0 of machine 0) prepares; the others wait for the folder by looking at the disk every few
seconds, which no process-group timeout bounds (a barrier would: `ddp_timeout`); a builder that dies ends their
wait with an error naming it ([`~builders.wait_for`]). Steps 2 and 3 can be made in shards by every process, or by
one job a shard ([`~mgsa_hf.training.shards`]). On several machines `prepared_dir` must be a folder they share, or
each machine prepares it beforehand with `mgsa-hf prepare` (the tokenizer's training gives the same vocabulary from
the same corpus on every machine); the run compares what every process prepared before it trains
(`distributed.check_same_inputs`).
"""

import contextlib
import gc
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from itertools import chain, islice, zip_longest
from pathlib import Path

from transformers.utils import logging

from .builders import building, remove_dead_staging, staging_folder
from .builders import wait_for as wait_for_builder
from .file_records import CHECKSUMS, check_files, file_digest, record_files
from .shards import MARKER, build_shard, check_prepared, launch_shard, load_listed, shard_splits, wait_for_shards


logger = logging.get_logger(__name__)

# the layout of the prepared folders and their keys; a change gives new keys
FORMAT_VERSION = 2
# how often a waiting process looks for the prepared folder, and how often it says that it still waits (seconds)
POLL_SECONDS, REPORT_SECONDS = 2.0, 300.0


def content_key(parts: dict) -> str:
    """A short hash of `parts` (JSON-serialisable), the name of a prepared folder."""
    text = json.dumps({"format": FORMAT_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def file_identity(path: str | Path, root: str | Path | None = None) -> dict:
    """A local file's content: its name (relative to `root`, the corpus folder, or the bare name) and the hash of its
    bytes, not its path or times, so the same corpus at two paths or on two machines gets the same key, and a
    changed file a new one. A file that does not exist is named as such: reading the corpus then says so."""
    path = Path(path)
    name = str(path.relative_to(root)) if root else path.name
    if not path.is_file():
        return {"file": name, "missing": str(path)}
    return {"file": name, "size": path.stat().st_size, "sha256": file_digest(path)}


def corpus_parts(config) -> dict:
    """What decides the corpus step's content (see the module's docstring), from a [`TrainConfig`]."""
    source = Path(config.data)
    if source.is_dir():
        files = sorted(path for path in source.rglob("*") if path.is_file())
        data = [file_identity(path, source) for path in files]
    elif source.is_file():
        data = [file_identity(source)]
    else:
        data = {"hub": str(config.data), "config": config.hub_config}
    trees = {split: file_identity(path) for split, path in sorted((config.trees or {}).items()) if path}
    limits = {"train": config.max_train_samples, "validation": config.max_eval_samples,
              "test": config.max_test_samples}
    return {"data": data, "splits": config.splits, "languages": [config.source_lang, config.target_lang],
            "trees": trees, "tree_column": config.tree_column, "limits": limits, "cleaning": cleaning(config)}


def is_prepared(folder: Path) -> bool:
    """Whether `folder` is a complete preparation step (its marker file is written last)."""
    return (folder / MARKER).is_file()


def build_once(folder: Path, build: Callable[[Path], dict], is_main: bool, what: str) -> Path:
    """`folder`, complete: the main process builds it (unless it is complete already) by `build(staging)`, which
    writes into `staging` and returns what `prepared.json` records; `staging` is then renamed to `folder`. The other
    processes wait for it (see [`wait_for`]). The builder announces itself beside `folder` while it works
    ([`~builders.building`]): a failed build leaves `<folder>.failed` with its error, which ends the others' wait
    with that error, and a killed one ends their wait naming its process. Staging folders of builds whose process
    has ended are removed first.

    Returns:
        `folder`.
    """
    if is_prepared(folder):
        return folder
    if not is_main:
        wait_for(folder, what)
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_staging(folder)
    staging = staging_folder(folder)
    shutil.rmtree(staging, ignore_errors=True)
    started = time.perf_counter()
    with building(folder):
        try:
            record = build(staging)
            record = {**record, CHECKSUMS: record_files(staging), "seconds": round(time.perf_counter() - started, 1)}
            (staging / MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
            if folder.exists():  # an earlier build cut short before its record: not a prepared folder
                shutil.rmtree(folder)
            os.replace(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    logger.info("%s prepared in %.0f s: %s", what, time.perf_counter() - started, folder)
    return folder


def wait_for(folder: Path, what: str, poll_seconds: float = POLL_SECONDS,
             report_seconds: float = REPORT_SECONDS) -> None:
    """Wait, looking at the disk every `poll_seconds`, until the main process has prepared `folder`; say so every
    `report_seconds`.

    Raises:
        `RuntimeError` with the main process's error when its build failed (`<folder>.failed`), or naming its host
        and process when it ended without finishing (see [`~builders.wait_for`]).
    """
    logger.warning("waiting for the main process to prepare %s (%s)", what, folder)
    wait_for_builder(folder, what, lambda: is_prepared(folder), poll_seconds, report_seconds,
                     " On several machines it must be a folder they share (`prepared_dir`), or run `mgsa-hf prepare` "
                     "with the same recipe and data on each first.")


# ---------------------------------------------------------------------------------------------------------------------
# the corpus step


def _text_pairs(source_file: str, target_file: str, src_lang: str, tgt_lang: str, limit: int | None):
    """Rows `{"translation": {src: ..., tgt: ...}}` of two aligned text files, read line by line."""
    from ..tokenization_utils import read_lines

    pairs = zip_longest(read_lines(source_file), read_lines(target_file))
    number = 0
    for number, (source, target) in enumerate(islice(pairs, limit), 1):
        if source is None or target is None:
            shorter = source_file if source is None else target_file
            raise ValueError(f"{source_file} and {target_file} differ in length: {shorter} ends after line "
                             f"{number - 1}; the files must be aligned line by line.")
        yield {"translation": {src_lang: source, tgt_lang: target}}
    if number == 0:
        raise ValueError(f"{source_file} is empty.")


def _read_split(config, name: str, corpus_split: str, cache_dir: Path):
    """One split of a folder of `{split}.{lang}[.gz]` files as an Arrow-backed `Dataset` in `cache_dir`, read in
    batches; `None` when the folder holds the split as JSONL or Arrow tables (read by [`load_parallel_corpus`])."""
    from datasets import Dataset, Features, Value
    from datasets.exceptions import DatasetGenerationError

    from .data import find_split_file

    folder = Path(config.data)
    tables = [folder / "dataset_dict.json", *(folder / f"{corpus_split}.{suffix}" for suffix in ("jsonl", "parquet",
                                                                                                   "arrow"))]
    if any(path.is_file() for path in tables):  # read by `load_parallel_corpus`
        return None
    limit = {"train": config.max_train_samples, "validation": config.max_eval_samples,
             "test": config.max_test_samples}.get(name)
    files = [str(find_split_file(folder, corpus_split, lang)) for lang in (config.source_lang, config.target_lang)]
    features = Features({"translation": {config.source_lang: Value("string"), config.target_lang: Value("string")}})
    try:
        return Dataset.from_generator(_text_pairs, features=features, cache_dir=str(cache_dir), keep_in_memory=False,
                                      gen_kwargs={"source_file": files[0], "target_file": files[1],
                                                  "src_lang": config.source_lang, "tgt_lang": config.target_lang,
                                                  "limit": limit})
    except DatasetGenerationError as error:  # the files' own problem, named by `_text_pairs` or `read_lines`
        raise (error.__cause__ if isinstance(error.__cause__, ValueError) else error) from None


def cleaning(config) -> dict | None:
    """The recipe's corpus cleaning (`clean_min_words`, `clean_max_words`, `clean_max_ratio`), checked; None when it
    sets none."""
    rule = {"min_words": config.clean_min_words, "max_words": config.clean_max_words,
            "max_ratio": config.clean_max_ratio}
    if all(value is None for value in rule.values()):
        return None
    for key, lowest in (("min_words", 0), ("max_words", 1), ("max_ratio", 1)):
        value = rule[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < lowest
                                  or (key != "max_ratio" and not isinstance(value, int))):
            kind = "a number >= 1" if key == "max_ratio" else f"an integer >= {lowest}"
            raise ValueError(f"clean_{key} must be {kind} (or null), got {value!r}.")
    if rule["max_words"] is not None and (rule["min_words"] or 0) > rule["max_words"]:
        raise ValueError(f"clean_min_words ({rule['min_words']}) is larger than clean_max_words "
                         f"({rule['max_words']}).")
    return rule


def clean_pairs(train, config, batch_size: int = 10_000):
    """The training pairs that [`cleaning`]'s rule keeps (Moses' `clean-corpus-n.perl`: words are whitespace-separated
    tokens of each side), and how many it dropped for each reason (a pair too short, too long, or out of ratio counts
    for the first that applies)."""
    import numpy as np

    rule = cleaning(config)
    if rule is None:
        return train, None
    low, high = rule["min_words"] or 0, rule["max_words"] or float("inf")
    ratio = rule["max_ratio"] or float("inf")
    reasons = np.zeros(len(train), dtype=np.int8)  # 0 kept, 1 too short, 2 too long, 3 ratio
    for start in range(0, len(train), batch_size):
        pairs = train[start:start + batch_size]["translation"]
        lengths = np.array([[len(pair[config.source_lang].split()), len(pair[config.target_lang].split())]
                            for pair in pairs]).reshape(-1, 2)
        shortest, longest = lengths.min(axis=1), lengths.max(axis=1)
        reason = np.where(shortest < low, 1, np.where(longest > high, 2,
                                                      np.where(longest > ratio * np.maximum(shortest, 1), 3, 0)))
        reasons[start:start + len(pairs)] = reason
    dropped = {name: int((reasons == code).sum()) for code, name in ((1, "too_short"), (2, "too_long"),
                                                                   (3, "ratio"))}
    logger.warning("corpus cleaning (%s) dropped %d of %d training pairs: %s", rule, int((reasons > 0).sum()),
                   len(train), dropped)
    return train.select(np.flatnonzero(reasons == 0)), {"rule": rule, "pairs": len(train), **dropped}


def build_corpus(config, staging: Path) -> dict:
    """Write the corpus step's splits into `staging` (see the module's docstring); returns their sizes."""
    from datasets import DatasetDict

    from .data import load_parallel_corpus

    cache_dir = staging.with_name(staging.name + "-text")
    shutil.rmtree(cache_dir, ignore_errors=True)
    try:
        wanted = {name: split for name, split in config.splits.items() if split}
        streamed = {}
        if Path(config.data).is_dir() and not config.trees and config.tree_column is None:
            streamed = {name: data for name, split in wanted.items()
                        if (data := _read_split(config, name, split, cache_dir)) is not None}
        rest = {name: split for name, split in wanted.items() if name not in streamed}
        corpus = dict(streamed)
        if rest:
            loaded = load_parallel_corpus(config.data, config.source_lang, config.target_lang, rest,
                                          hub_config=config.hub_config, tree_files=config.trees or None,
                                          tree_column=config.tree_column)
            limits = {"train": config.max_train_samples, "validation": config.max_eval_samples,
                      "test": config.max_test_samples}
            for name, data in loaded.items():
                limit = limits.get(name)
                corpus[name] = data.select(range(min(limit, len(data)))) if limit is not None else data
        if "train" not in corpus:
            raise ValueError("the corpus needs a `train` split (see `splits`).")
        corpus["train"], dropped = clean_pairs(corpus["train"], config)
        corpus = DatasetDict({name: corpus[name] for name in wanted if name in corpus})
        corpus.save_to_disk(str(staging))
        return {"step": "corpus", "rows": {name: len(data) for name, data in corpus.items()}, "dropped": dropped,
                "parts": corpus_parts(config)}
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


# the narrowest integer type of each processed field (checked as it is written): token ids take int16 up to a 32,768
# vocabulary (int32 above); source positions, word and phrase indices, and depths int16 (sources are cut at the
# model's positions, far below 32,767); phrase tags int8 (-100 and the tag ids). `attention_mask` is all ones before
# padding and is not stored: the collator makes it.
FIELD_TYPES = {"word_ids": "int16", "head_word_ids": "int16", "phrase_ids": "int16", "phrase_tags": "int8",
               "pr_phrase_ids": "int16", "local_phrase_start": "int16", "local_phrase_end": "int16",
               "tree_depth": "int16", "decoder_attention_mask": "int8"}
UNSTORED_FIELDS = ("attention_mask",)


@contextlib.contextmanager
def frozen_gc():
    """Leaves the objects alive on entry (the imports' hundreds of thousands, the corpus) out of the cyclic garbage
    collector's work for the block (`gc.freeze`): the rows that a step makes would otherwise trigger full collections
    that walk all of them again and again. Worker processes forked inside the block inherit it; the rows themselves
    are collected as usual."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def processed_features(columns: list[str], vocab_size: int):
    """The `datasets.Features` of a processed split with `columns` (the processor's output fields but those not
    stored): every field a list per sentence (a list of lists for the levelled syntax fields) of the narrowest integer
    type that holds its values ([`FIELD_TYPES`])."""
    from datasets import Features, Sequence, Value

    from ..syntax_fields import LEVELLED_SYNTAX_FIELDS

    ids = "int16" if vocab_size <= 2**15 else "int32"
    features = {}
    for column in columns:
        value = Value(FIELD_TYPES.get(column, ids if column in ("input_ids", "labels") else "int32"))
        features[column] = Sequence(Sequence(value)) if column in LEVELLED_SYNTAX_FIELDS else Sequence(value)
    return Features(features)


class _NarrowRows:
    """The processor's `map` function over a batch of rows, with its output checked against the narrow types of
    `features` (a value out of range stops the step, naming the field, the row and the value) and without the fields
    that are not stored."""

    def __init__(self, processor, features, split: str, parse_columns: tuple[str, ...] = (), **fn_kwargs):
        import numpy as np

        self.processor, self.split, self.fn_kwargs = processor, split, fn_kwargs
        self.parse_columns = parse_columns  # columns of the batch that hold the sources' parses
        self.ranges = {}
        for column, feature in features.items():
            while hasattr(feature, "feature"):  # Sequence(Sequence(Value)) -> Value
                feature = feature.feature
            info = np.iinfo(feature.dtype)
            self.ranges[column] = (feature.dtype, info.min, info.max)

    def __call__(self, batch, indices):
        import numpy as np

        from ..syntax_fields import LEVELLED_SYNTAX_FIELDS

        parses = None
        if self.parse_columns:
            parses = [dict(zip(self.parse_columns, row, strict=True))
                      for row in zip(*(batch[column] for column in self.parse_columns), strict=True)]
        rows = self.processor._map_batch(batch, indices, parses=parses, **self.fn_kwargs)
        for column in UNSTORED_FIELDS:
            rows.pop(column, None)
        for column, values in rows.items():
            dtype, low, high = self.ranges[column]
            # the lists of integers of the batch (a row's levels for the levelled fields), their extremes
            lists = [part for part in (chain.from_iterable(values) if column in LEVELLED_SYNTAX_FIELDS else values)
                     if part]
            if lists and (min(map(min, lists)) < low or max(map(max, lists)) > high):
                for index, row in zip(indices, values, strict=True):
                    row = np.array(row, dtype=object).ravel().astype(np.int64) if row else np.zeros(0, np.int64)
                    if row.size and (row.min() < low or row.max() > high):
                        value = row.min() if row.min() < low else row.max()
                        raise ValueError(f"the {self.split} split, row {index}: `{column}` holds {value}, outside "
                                         f"the {dtype} it is stored as ({low}..{high}): see corpus.FIELD_TYPES.")
        return rows


@frozen_gc()
def build_processed(processor, corpus, config, staging: Path, num_proc: int | None, limit: int | None,
                    parsed=None) -> dict:
    """Write the tokenized (and parsed) splits of `corpus` into `staging` with `num_proc` worker processes; returns
    their sizes and files. `parsed`, the splits' parses ([`build_parsed`]), stands for the parser (and the trees):
    the fields are derived from them. The training split is cut at `max_source_length` / `max_target_length`; the
    others, which are scored, at the model's positions alone (`limit`; None: not at all). Each split is written once,
    straight into its Arrow file(s) in `staging` (`<split>.arrow`, or one file per worker), with
    [`processed_features`]: no copy, no type inference."""
    from datasets import concatenate_datasets

    from ..syntax_trees import PARSE_FIELDS
    from .data import TREE_COLUMN

    tree_column = TREE_COLUMN if TREE_COLUMN in corpus["train"].column_names and parsed is None else None
    source, target = f"translation.{config.source_lang}", f"translation.{config.target_lang}"
    # the processor's output fields, in its order, but those not stored
    syntax_fields = stored_syntax_fields(config, processor)
    columns = ["input_ids", *syntax_fields, "labels"]
    features = processed_features(columns, len(processor.tokenizer))
    staging.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, data in corpus.flatten().items():
        lengths = (dict(max_length=config.max_source_length, max_target_length=config.max_target_length,
                        truncation=True) if split == "train" else
                   dict(max_length=limit, max_target_length=limit, truncation=limit is not None))
        if parsed is not None:
            if len(parsed[split]) != len(data):
                raise ValueError(f"the parsed {split} split holds {len(parsed[split])} rows for the {len(data)} of "
                                 "the corpus: remove its folder from `prepared_dir` to parse it again.")
            data = concatenate_datasets([data, parsed[split].select_columns(list(PARSE_FIELDS))], axis=1)
        function = _NarrowRows(processor, features, split, parse_columns=PARSE_FIELDS if parsed is not None else (),
                               source_column=source, target_column=target, tree_column=tree_column,
                               syntax_fields=syntax_fields or None, **lengths)
        workers = num_proc if num_proc and num_proc > 1 and len(data) >= 10 * num_proc else None
        mapped = data.map(function, batched=True, with_indices=True, batch_size=1000, num_proc=workers,
                          remove_columns=data.column_names, features=features, load_from_cache_file=False,
                          cache_file_name=str(staging / f"{split}.arrow"), desc=f"Preparing {split}")
        files[split] = [Path(file["filename"]).name for file in mapped.cache_files]
        del mapped
    return {"step": "processed", "rows": {name: len(data) for name, data in corpus.items()}, "files": files,
            "features": {column: str(feature) for column, feature in features.items()}, "num_proc": num_proc or 1}


# the Arrow types of a parse's fields (`SentenceSyntax.to_parse`)
PARSE_TYPES = {"spans": ("int32", 2), "heads": ("int32", 1), "paths": ("int32", 2), "labels": ("string", 1)}


def parsed_features():
    """The `datasets.Features` of a parsed split: one list per sentence (of lists for `spans` and `paths`)."""
    from datasets import Features, Sequence, Value

    features = {}
    for column, (dtype, depth) in PARSE_TYPES.items():
        feature = Value(dtype)
        for _ in range(depth):
            feature = Sequence(feature)
        features[column] = feature
    return Features(features)


class _ParseRows:
    """The parser's `map` function over a batch of rows: the parse of each source sentence (with its given tree)."""

    def __init__(self, processor, source_column: str, tree_column: str | None):
        self.processor, self.source_column, self.tree_column = processor, source_column, tree_column

    def __call__(self, batch, indices):
        from ..syntax_trees import PARSE_FIELDS, TreeError

        trees = [tree or None for tree in batch[self.tree_column]] if self.tree_column else None
        try:
            parses = self.processor.parse(batch[self.source_column], trees)
        except TreeError as error:  # name the dataset's row, as `MgsaProcessor.map_dataset` does
            where = f"column {self.tree_column!r}" if error.tree_parser is None else \
                f"the tree that tree_parser={error.tree_parser!r} gave"
            raise ValueError(f"Dataset row {indices[error.index]}, {where}: {error.reason}") from None
        return {name: [parse[name] for parse in parses] for name in PARSE_FIELDS}


@frozen_gc()
def build_parsed(processor, corpus, config, staging: Path, num_proc: int | None) -> dict:
    """Write the parse of every source sentence of `corpus` ([`MgsaProcessor.parse`], with the corpus's trees) into
    `staging` with `num_proc` worker processes, as [`build_processed`] writes its fields; returns the splits' sizes
    and files."""
    from .data import TREE_COLUMN

    tree_column = TREE_COLUMN if TREE_COLUMN in corpus["train"].column_names else None
    function = _ParseRows(processor, f"translation.{config.source_lang}", tree_column)
    staging.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, data in corpus.flatten().items():
        workers = num_proc if num_proc and num_proc > 1 and len(data) >= 10 * num_proc else None
        mapped = data.map(function, batched=True, with_indices=True, batch_size=1000, num_proc=workers,
                          remove_columns=data.column_names, features=parsed_features(), load_from_cache_file=False,
                          cache_file_name=str(staging / f"{split}.arrow"), desc=f"Parsing {split}")
        files[split] = [Path(file["filename"]).name for file in mapped.cache_files]
        del mapped
    return {"step": "parsed", "rows": {name: len(data) for name, data in corpus.items()}, "files": files,
            "parser": processor.parse_fingerprint(), "num_proc": num_proc or 1}


def parsed_parts(corpus_key: str, processor) -> dict:
    """What decides the parsed step's content, besides the corpus: the parser's identity alone."""
    return {"corpus": corpus_key, "parser": processor.parse_fingerprint()}


def load_processed(folder: Path):
    """The processed (or parsed) splits of a prepared folder, memory-mapped: a `DatasetDict` of the Arrow files its
    record lists ([`~mgsa_hf.training.shards.load_listed`])."""
    return load_listed(folder)


def stored_syntax_fields(config, processor) -> tuple[str, ...]:
    """The syntax fields a processed split stores: those the model to train reads
    ([`~mgsa_hf.training.config.source_syntax_fields`]); every field when the processor is told to parse for a model
    that reads none; none without syntax."""
    from ..syntax_fields import SOURCE_SYNTAX_PAD_VALUES
    from .config import source_syntax_fields

    if not processor.with_syntax:
        return ()
    return source_syntax_fields(config) or tuple(SOURCE_SYNTAX_PAD_VALUES)


def processed_parts(config, corpus_key: str, processor, limit: int | None) -> dict:
    """What decides the processed step's content, besides the corpus."""
    return {"corpus": corpus_key, "processor": processor._fingerprint(),
            "lengths": [config.max_source_length, config.max_target_length, limit],
            "fields": list(stored_syntax_fields(config, processor))}


# ---------------------------------------------------------------------------------------------------------------------
# the recipe's preparation: corpus, tokenizer, processed splits


def prepared_dir(config) -> Path:
    """Where the recipe's prepared folders go: `prepared_dir`, else the run folder's `prepared/`."""
    from .ownership import run_folder

    return Path(config.prepared_dir) if config.prepared_dir else run_folder(config.output_dir) / "prepared"


def tokenizer_sample(train_split, lang: str, max_sentences: int | None) -> list[str]:
    """The `lang` side of the training split, or of `max_sentences` of its pairs drawn evenly over it (a corpus of
    several sources, such as WMT, is sampled from all of them)."""
    size = len(train_split)
    if max_sentences is None or size <= max_sentences:
        rows = train_split
    else:
        step = size / max_sentences
        rows = train_split.select([int(i * step) for i in range(max_sentences)])
    return [pair[lang] for pair in rows["translation"]]


def tokenizer_record(config, corpus_key: str) -> dict:
    """What the run's tokenizer is trained for and on: the vocabulary's size and languages, the prepared corpus it was
    learnt from ([`content_key`] of [`corpus_parts`]: the files' content, splits and limits), the sample's size
    (`tokenizer_max_sentences`) and the trainer (SentencePiece's version and threads). Trainings on the same record
    give the same files ([`~mgsa_hf.tokenization_utils.train_joint_tokenizer`]), on any machine."""
    from importlib.metadata import version

    from ..tokenization_utils import TRAINER_THREADS

    return {"vocab_size": config.vocab_size, "source_lang": config.source_lang, "target_lang": config.target_lang,
            "corpus": corpus_key, "max_sentences": config.tokenizer_max_sentences,
            "trainer": f"sentencepiece {version('sentencepiece')}, {TRAINER_THREADS} threads"}


def _record_serves(record: dict | None, wanted: dict, resuming: bool) -> bool:
    """Whether a tokenizer recorded as `record` serves a run that wants `wanted`: the same record; or, resuming (the
    checkpoints embed the tokenizer the run began with), no record, or one written before the record named all it
    names now (the corpus, the trainer) that agrees on what it holds."""
    if record == wanted:
        return True
    if not resuming:
        return False
    return record is None or (record.keys() < wanted.keys()
                              and all(wanted.get(key) == value for key, value in record.items()))


def corpus_record(config) -> dict:
    """The `prepared.json` of the recipe's corpus step (its rows, and what cleaning dropped), once prepared."""
    folder = prepared_dir(config) / f"corpus-{content_key(corpus_parts(config))}"
    return json.loads((folder / MARKER).read_text(encoding="utf-8")) if is_prepared(folder) else {}


def load_or_train_tokenizer(config, train_split, is_main: bool = True, corpus_key: str | None = None):
    """`config.tokenizer` (or `init_from`'s) if given; else the joint vocabulary in the run folder's `tokenizer/`,
    trained by the main process on the training split (at most `tokenizer_max_sentences` pairs of it) the first time;
    the other processes wait for it and load it, as do resumed runs. The folder records what it was trained for and
    on ([`tokenizer_record`], `trained_for.json`; `corpus_key` names the corpus, by default the recipe's): a later
    run in the same `output_dir` that asks for another vocabulary, or learns it from another corpus or sample, trains
    it again, or, resuming, stops (its checkpoints embed the earlier one). The folder is swapped in whole with its
    record: one without the record (a run stopped while saving it) is trained again."""
    import tempfile

    from transformers import AutoTokenizer

    from ..atomic_saves import staged_folder
    from ..tokenization_utils import train_joint_tokenizer
    from .ownership import run_folder

    if config.tokenizer or config.init_from:  # a fine-tuned checkpoint comes with its tokenizer
        source = config.tokenizer or config.init_from
        try:
            return AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError) as error:
            name = "tokenizer" if config.tokenizer else "init_from"
            raise ValueError(f"{name}={source!r}: no tokenizer could be loaded from it ({error}); set `tokenizer` to "
                             "the folder of the checkpoint's tokenizer.") from None
    folder = run_folder(config.output_dir) / "tokenizer"
    wanted = tokenizer_record(config, corpus_key or content_key(corpus_parts(config)))
    if not is_main:
        _wait_for_tokenizer(folder, wanted, bool(config.resume_from_checkpoint))
        _check_tokenizer(folder)
        return AutoTokenizer.from_pretrained(folder)
    with building(folder):  # a failure leaves `tokenizer.failed`, which ends the other processes' wait
        if folder.exists():
            trained_for = _tokenizer_record(folder)
            if _record_serves(trained_for, wanted, bool(config.resume_from_checkpoint)):
                _check_tokenizer(folder)
                return AutoTokenizer.from_pretrained(folder)
            changed = ", ".join(f"{key}={(trained_for or {}).get(key)!r} → {value!r}" for key, value in wanted.items()
                                if (trained_for or {}).get(key) != value)
            if trained_for is not None and config.resume_from_checkpoint:
                raise ValueError(f"the run's tokenizer in {folder} was trained for other settings ({changed}), which "
                                 "the checkpoints to resume embed: resume with the settings of the run, or start a "
                                 "new run in another `output_dir`.")
            damaged = (folder / "trained_for.json").is_file()  # a record that does not read: named, not "missing"
            logger.warning("the tokenizer in %s %s: training it again.", folder,
                           f"was trained for other settings ({changed})" if trained_for else
                           f"has a damaged record of its settings ({folder / 'trained_for.json'})" if damaged else
                           "has no record of its settings (a run stopped saving it)")
        # trained and recorded beside the run folder, then swapped in whole: a run stopped meanwhile leaves none
        with staged_folder(folder, replaces=("*",)) as staging, tempfile.TemporaryDirectory() as text_dir:
            files = {}
            for lang in (config.source_lang, config.target_lang):
                files[lang] = Path(text_dir) / f"train.{lang}"
                lines = tokenizer_sample(train_split, lang, config.tokenizer_max_sentences)
                files[lang].write_text("\n".join(lines) + "\n", encoding="utf-8")
            train_joint_tokenizer(files[config.source_lang], files[config.target_lang], staging,
                                  vocab_size=config.vocab_size)
            (staging / "trained_for.json").write_text(json.dumps({**wanted, CHECKSUMS: record_files(staging)}) + "\n")
        return AutoTokenizer.from_pretrained(folder)


def _tokenizer_record(folder: Path) -> dict | None:
    """What the run's tokenizer in `folder` was trained for (`trained_for.json`, without its files' checksums); None
    without a readable record."""
    try:
        record = json.loads((folder / "trained_for.json").read_text())
    except (OSError, ValueError):  # no record, or one cut short
        return None
    if isinstance(record, dict):
        record.pop(CHECKSUMS, None)
    return record


def _check_tokenizer(folder: Path) -> None:
    """Check the files of the run's tokenizer in `folder` against the sizes and SHA-256s its `trained_for.json`
    records (a tokenizer trained before the record is not checked); a `ValueError` names a file missing or damaged."""
    try:
        record = json.loads((folder / "trained_for.json").read_text())
    except (OSError, ValueError):  # no record: a resumed run's tokenizer, taken as it is
        return
    check_files(folder, record if isinstance(record, dict) else {}, folder / "trained_for.json",
                advice=f"The run's tokenizer in {folder} was damaged after it was trained: remove the folder to train "
                       "it again; to resume the run, put the tokenizer files of its last checkpoint in its place, "
                       "without `trained_for.json` (a resumed run takes a tokenizer without a record as it is).")


def _wait_for_tokenizer(folder: Path, wanted: dict, resuming: bool) -> None:
    """Wait until the main process has the run's tokenizer for `wanted` (a resumed run's, recorded or not: the main
    process takes it as it is) in `folder` (see [`wait_for`])."""

    def trained() -> bool:
        record = _tokenizer_record(folder)
        return _record_serves(record, wanted, resuming) and (record == wanted
                                                             or (folder / "tokenizer_config.json").is_file())

    wait_for_builder(folder, "the run's tokenizer", trained, POLL_SECONDS, REPORT_SECONDS)


def prepare(config, is_main: bool = True, num_proc: int | None = None, shard: tuple[int, int] | None = None,
            wait: bool = True):
    """The corpus, the processor and the processed splits of a recipe ([`TrainConfig`]), prepared once (see the
    module's docstring) and loaded memory-mapped. `is_main`: this process prepares what is missing (the others wait
    for it). The corpus is parsed only when the model reads syntax (set `processor.with_syntax` to choose).
    `shard=(i, n)`: this process makes shard `i` of `n` of the processed step ([`~mgsa_hf.training.shards`]; by
    default the recipe's `prepare_in_shards` under a launch), then waits for the others' (`wait`), or returns `None`
    for the processed splits while shards are missing (`mgsa-hf prepare --shard I/N`).

    Returns:
        `(corpus, processor, processed)`: `DatasetDict`s of the raw pairs (a `translation` column, and the given trees
        as `source_tree`) and of the model's fields, and the [`MgsaProcessor`].
    """
    from datasets import load_from_disk

    from ..processing_mgsa import MgsaProcessor
    from .config import _reads_source_syntax, source_position_limit
    from .conversion import saved_processor_settings
    from .data import TREE_COLUMN

    if config.trees is not None and not isinstance(config.trees, dict):
        raise ValueError(f"`trees` maps a split to a file of PTB trees, e.g. {{train: train.trees}}, got "
                         f"{config.trees!r}.")
    root = prepared_dir(config)
    corpus_key = content_key(corpus_parts(config))
    corpus_folder = build_once(root / f"corpus-{corpus_key}", lambda staging: build_corpus(config, staging),
                               is_main, "the corpus")
    check_prepared(corpus_folder)
    corpus = load_from_disk(str(corpus_folder))
    tokenizer = load_or_train_tokenizer(config, corpus["train"], is_main, corpus_key)
    settings = {**saved_processor_settings(config.init_from, config.processor, config.trust_remote_code),
                "with_syntax": _reads_source_syntax(config), **config.processor}
    processor = MgsaProcessor(tokenizer, **settings)
    if TREE_COLUMN in corpus["train"].column_names and not processor.with_syntax:
        logger.warning("the model reads no syntax (encoder_type transformer): the given trees are not used.")
    num_proc = num_proc if num_proc is not None else config.num_proc
    limit = source_position_limit(config)
    key = content_key(processed_parts(config, corpus_key, processor, limit))
    processed_folder = root / f"processed-{key}"
    # the parse's folder, for fields to make that read syntax (its key names the parser, which loads spaCy)
    parsing = processor.with_syntax and not is_prepared(processed_folder)
    parsed_folder = root / f"parsed-{content_key(parsed_parts(corpus_key, processor))}" if parsing else None
    what = "the tokenized and parsed corpus" if processor.with_syntax else "the tokenized corpus"
    shard = shard if shard is not None else launch_shard(config)
    if shard is not None and not is_prepared(processed_folder):  # this process's part of the parse, then its fields
        parsed = None
        if parsing:
            build_shard(parsed_folder, shard,
                        lambda staging, cut: build_parsed(processor, cut(corpus), config, staging, num_proc))
            parsed = shard_splits(parsed_folder, shard)
        complete = build_shard(processed_folder, shard, lambda staging, cut: build_processed(
            processor, cut(corpus), config, staging, num_proc, limit, parsed))
        if not complete:
            if not wait:
                return corpus, processor, None
            wait_for_shards(processed_folder, shard[1], what, POLL_SECONDS, REPORT_SECONDS)
        return corpus, processor, load_processed(processed_folder)
    parsed = None
    if parsing:
        build_once(parsed_folder, lambda staging: build_parsed(processor, corpus, config, staging, num_proc),
                   is_main, "the parsed corpus")
        parsed = load_processed(parsed_folder)
    build_once(processed_folder,
               lambda staging: build_processed(processor, corpus, config, staging, num_proc, limit, parsed),
               is_main, what)
    return corpus, processor, load_processed(processed_folder)
