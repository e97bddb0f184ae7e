"""Parallel corpora: a folder of `{split}.{lang}[.gz]` files (e.g. Multi30k), of `{split}.jsonl` files or of Arrow
tables (`{split}.parquet`, `{split}.arrow`, or a `save_to_disk` folder), a JSONL file, or a Hub dataset id.

Every loader returns a `datasets.DatasetDict` whose splits have a `translation` column of `{src_lang: ..., tgt_lang:
...}` dicts, the layout of Hub translation datasets, and, when trees of the source sentences are given (tree files or
a column of the data), a `source_tree` column of PTB bracketed strings (`None`: the processor's own tree). Problems
with the files are reported before any training starts.
"""

import json
from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset

from ..tokenization_utils import read_lines
from .catalogue import looks_local, missing_data_message


# the column of the source sentences' PTB trees in the loaded corpus
TREE_COLUMN = "source_tree"


def find_split_file(folder: Path, split: str, lang: str) -> Path:
    """The file `{split}.{lang}` or `{split}.{lang}.gz` of `folder`; `FileNotFoundError` naming both when neither is
    there."""
    for candidate in (folder / f"{split}.{lang}", folder / f"{split}.{lang}.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no file for split {split!r}, language {lang!r} in {folder}: expected {split}.{lang}[.gz]"
    )


def _text_lines(path: Path) -> list[str]:
    r"""The lines of a UTF-8 text file (`.gz` read compressed), split at `\n` only (see
    [`~mgsa_hf.tokenization_utils.read_lines`]); a `ValueError` names the file and line of bytes that are not UTF-8
    or of a damaged gzip file."""
    return list(read_lines(path))


def read_parallel_split(folder: str | Path, split: str, src_lang: str, tgt_lang: str) -> Dataset:
    r"""Read `{split}.{src_lang}[.gz]` and `{split}.{tgt_lang}[.gz]` (UTF-8, aligned line by line; lines end at `\n`
    alone, see [`~mgsa_hf.tokenization_utils.read_lines`]) as a `translation` Dataset."""
    folder = Path(folder)
    source_file, target_file = find_split_file(folder, split, src_lang), find_split_file(folder, split, tgt_lang)
    source, target = _text_lines(source_file), _text_lines(target_file)
    if len(source) != len(target):
        raise ValueError(
            f"split {split!r}: {source_file} has {len(source)} lines but {target_file} has {len(target)}; the files "
            "must be aligned line by line."
        )
    if not source:
        raise ValueError(f"split {split!r} of {folder} is empty.")
    pairs = [{src_lang: s, tgt_lang: t} for s, t in zip(source, target, strict=True)]
    return Dataset.from_dict({"translation": pairs})


def _read_jsonl(path: Path, src_lang: str, tgt_lang: str, tree_column: str | None = None) -> Dataset:
    """A JSON-lines file of `{"translation": {src: ..., tgt: ...}}` or `{src: ..., tgt: ...}` records, one per line
    (blank lines skipped). `tree_column` names a top-level field of PTB trees of the source sentences (records
    without it, or with `null` or `""`, have none). A `ValueError` names the line of a record that is not JSON or
    lacks the text fields."""
    pairs, trees = [], []
    for number, line in enumerate(_text_lines(path), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: not a JSON record ({error.msg} at column "
                             f"{error.colno}): {line[:200]}") from None
        where = f"{path}, line {number}: record {len(pairs) + 1}"
        pair = record.get("translation", record) if isinstance(record, dict) else record
        if not isinstance(pair, dict) or not isinstance(pair.get(src_lang), str) or \
                not isinstance(pair.get(tgt_lang), str):
            raise ValueError(f"{where} has no {src_lang!r}/{tgt_lang!r} text fields: {str(record)[:200]}")
        pairs.append({src_lang: pair[src_lang], tgt_lang: pair[tgt_lang]})
        if tree_column is not None:
            tree = record.get(tree_column)
            if tree is not None and not isinstance(tree, str):
                raise ValueError(f"{where} has a {type(tree).__name__} as {tree_column!r}, not a PTB bracketed "
                                 "string (or null).")
            trees.append(tree or None)
    if not pairs:
        raise ValueError(f"{path} holds no sentence pairs.")
    if tree_column is not None:
        _check_trees(trees, [pair[src_lang] for pair in pairs], f"{path}: the {tree_column!r} tree of record")
    columns = {"translation": pairs} if tree_column is None else {"translation": pairs, TREE_COLUMN: trees}
    return Dataset.from_dict(columns)


def load_parallel_corpus(
    source: str | Path,
    src_lang: str,
    tgt_lang: str,
    splits: dict[str, str],
    hub_config: str | None = None,
    *,
    tree_files: dict[str, str | Path] | None = None,
    tree_column: str | None = None,
) -> DatasetDict:
    """
    Load a parallel corpus, and optionally PTB trees of its source sentences.

    Args:
        source: a folder of `{split}.{lang}[.gz]` files, of `{split}.jsonl` files or of Arrow tables (a
            `{split}.parquet` or `{split}.arrow` file per split, or a `save_to_disk` folder: a `translation` column or
            a column per language, as for the Hub), a `.jsonl` file (used
            for the train split) or a Hub dataset id (needs network access) whose splits have a `translation` column
            or a column per language (e.g. `bentrevett/multi30k`: `en`, `de`).
        src_lang, tgt_lang: language codes, e.g. `"en"`, `"de"`.
        splits: our split name → the corpus' split name, e.g. `{"train": "train", "validation": "val",
            "test": "test_2016_flickr"}`; a split mapped to `None` is skipped.
        hub_config: the Hub dataset's configuration name (e.g. `"de-en"` for `wmt16`), if it has several.
        tree_files: our split name → a file of PTB bracketed trees (`.gz` read compressed), one line per source
            sentence of that split in order, an empty line where the processor should use its own tree (see
            [`read_tree_file`]). Splits without a file get no trees.
        tree_column: for JSONL files and Hub datasets: the field or column holding the PTB tree of each source
            sentence (`null` or `""`: none).

    Returns:
        `DatasetDict` with a `translation` column per split, and a `source_tree` column ([`TREE_COLUMN`]) in every
        split when `tree_files` or `tree_column` is given.

    Raises:
        `ValueError` naming the file and line of bytes that are not UTF-8, of a corrupt or cut-short `.gz` file and
        of a JSONL line that is not a record with the text fields; naming both files and their numbers of lines
        when the two sides of a split differ in length; for a tree file whose number of lines is not the split's
        number of sentences, a tree that does not spell its sentence (naming the file and line), an unknown split (a
        Hub dataset's named with the splits it has), a Hub split without the language columns, or `tree_files` and
        `tree_column` together.
    """
    if tree_files and tree_column:
        raise ValueError("give the trees either as tree files per split or as a column of the data, not both.")
    if tree_column is not None and (not isinstance(tree_column, str) or not tree_column):
        raise ValueError(f"tree_column must be the name of a field of the data, got {tree_column!r}.")
    wanted = {name: corpus_split for name, corpus_split in splits.items() if corpus_split}
    path = Path(source)
    if path.is_dir() and (tables := _table_files(path, wanted.values())) is not None:
        corpus = DatasetDict({name: _hub_split(tables[corpus_split], name, src_lang, tgt_lang, tree_column)
                              for name, corpus_split in wanted.items()})
    elif path.is_dir():
        def read(corpus_split):
            jsonl = path / f"{corpus_split}.jsonl"
            if jsonl.is_file():
                return _read_jsonl(jsonl, src_lang, tgt_lang, tree_column)
            if tree_column is not None:
                raise ValueError(f"tree_column={tree_column!r} names a field of JSONL records or a column of a Hub "
                                 f"dataset, but split {corpus_split!r} of {path} is a pair of text files: give its "
                                 "trees as a tree file (`trees: {train: path}`) instead.")
            return read_parallel_split(path, corpus_split, src_lang, tgt_lang)

        corpus = DatasetDict({name: read(corpus_split) for name, corpus_split in wanted.items()})
    elif path.suffix == ".jsonl":
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {path} does not exist.")
        corpus = DatasetDict({"train": _read_jsonl(path, src_lang, tgt_lang, tree_column)})
    elif path.exists():
        raise FileNotFoundError(f"corpus {source} is neither a folder of split files nor a .jsonl file.")
    elif looks_local(source):
        raise FileNotFoundError(missing_data_message(source))
    else:
        hub = load_dataset(str(source), hub_config)
        unknown = sorted(set(wanted.values()) - set(hub))
        if unknown:
            raise ValueError(f"the Hub dataset {source} has no split(s) {unknown}; it has {sorted(hub)}: map ours to "
                             f"them with `splits`, e.g. {{train: train, validation: validation, test: test}}.")
        corpus = DatasetDict({name: _hub_split(hub[corpus_split], name, src_lang, tgt_lang, tree_column)
                              for name, corpus_split in wanted.items()})
    return _with_tree_files(corpus, tree_files, src_lang) if tree_files else corpus


def _table_files(folder: Path, corpus_splits) -> DatasetDict | None:
    """The splits of a folder of Arrow tables: a `DatasetDict` saved with `save_to_disk` (its `dataset_dict.json`),
    or a `{split}.parquet` / `{split}.arrow` file per split, read memory-mapped; None for a folder of text or JSONL
    files.

    Raises:
        `ValueError` naming the splits that the folder lacks.
    """
    from datasets import load_from_disk

    if (folder / "dataset_dict.json").is_file():
        tables = load_from_disk(str(folder))
    else:
        files = {split: [folder / f"{split}.{suffix}" for suffix in ("parquet", "arrow")
                         if (folder / f"{split}.{suffix}").is_file()] for split in corpus_splits}
        if not any(files.values()):
            return None
        missing = sorted(split for split, found in files.items() if not found)
        if missing:
            raise ValueError(f"{folder} holds Parquet/Arrow splits but none named {missing} "
                             "({split}.parquet or {split}.arrow).")
        tables = DatasetDict({split: load_dataset(found[0].suffix[1:], data_files=str(found[0]), split="train")
                              for split, found in files.items()})
    missing = sorted(set(corpus_splits) - set(tables))
    if missing:
        raise ValueError(f"the dataset saved in {folder} has no split(s) {missing}; it has {sorted(tables)}.")
    return tables


def _hub_split(split: Dataset, name: str, src_lang: str, tgt_lang: str, tree_column: str | None) -> Dataset:
    """A Hub split with its `translation` column (made from `src_lang` and `tgt_lang` columns when it has those
    instead, as bentrevett/multi30k does), and its tree column as [`TREE_COLUMN`] when `tree_column` is given."""
    if tree_column is not None and tree_column not in split.column_names:
        raise ValueError(f"tree_column={tree_column!r} is not a column of split {name!r} ({split.column_names}).")
    if "translation" not in split.column_names:
        if src_lang not in split.column_names or tgt_lang not in split.column_names:
            raise ValueError(f"split {name!r} of the Hub dataset has neither a `translation` column nor "
                             f"{src_lang!r} and {tgt_lang!r} columns: {split.column_names}.")
        split = split.map(lambda row: {"translation": {src_lang: row[src_lang], tgt_lang: row[tgt_lang]}},
                          remove_columns=[src_lang, tgt_lang], desc=f"{name}: `translation` column")
    if tree_column is None:
        return split
    split = split.select_columns(["translation", tree_column])
    return split if tree_column == TREE_COLUMN else split.rename_column(tree_column, TREE_COLUMN)


def _with_tree_files(corpus: DatasetDict, tree_files: dict, src_lang: str) -> DatasetDict:
    unknown = sorted(set(tree_files) - set(corpus))
    if unknown:
        raise ValueError(f"tree files given for split(s) {unknown}, but the corpus has the splits {sorted(corpus)}.")
    with_trees = {}
    for name, split in corpus.items():
        sources = [pair[src_lang] for pair in split["translation"]]
        trees = read_tree_file(tree_files[name], sources, name) if tree_files.get(name) else [None] * len(sources)
        with_trees[name] = split.add_column(TREE_COLUMN, trees)
    return DatasetDict(with_trees)


def read_tree_file(path: str | Path, sources: list[str], split: str = "train") -> list[str | None]:
    """The PTB bracketed trees of a file with one line per source sentence of a split, in order: a tree on one line,
    or an empty line where the processor should use its own tree (derived from the dependency parse, or from its
    `tree_parser`). Each tree is read and its leaves checked against its sentence
    ([`~mgsa_hf.syntax_trees.match_words`]) here, before any training.

    Raises:
        `FileNotFoundError`; `ValueError` when the file has another number of lines than `sources`, or naming the
        line of a tree that cannot be read or does not spell its sentence.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tree file {path} for split {split!r} does not exist.")
    lines = list(_text_lines(path))
    if len(lines) != len(sources):
        raise ValueError(
            f"tree file {path} has {len(lines)} lines but split {split!r} has {len(sources)} source sentences: write "
            "one PTB tree per source sentence, in order, on one line each, and an empty line where the processor "
            "should use its own tree."
        )
    trees = [line.strip() or None for line in lines]
    _check_trees(trees, sources, f"tree file {path}, line")
    return trees


def _check_trees(trees: list[str | None], sources: list[str], where: str) -> None:
    """Reads every tree and matches its leaves to its sentence; a `ValueError` names `where` and the 1-based number
    of the first bad one."""
    from ..syntax_trees import TreeError, read_tree

    for number, (tree, text) in enumerate(zip(trees, sources, strict=True), 1):
        if tree is not None:
            try:
                read_tree(text, tree, number, None)
            except TreeError as error:
                raise ValueError(f"{where} {number} (sentence {text!r}): {error.reason}") from None
