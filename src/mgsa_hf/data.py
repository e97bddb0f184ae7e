"""Parallel corpora: a folder of `{split}.{lang}[.gz]` files (e.g. Multi30k), a JSONL file, or a Hub dataset id.

Every loader returns a `datasets.DatasetDict` whose splits have a `translation` column of `{src_lang: ..., tgt_lang:
...}` dicts, the layout of Hub translation datasets. Problems with the files are reported before any training starts.
"""

from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset


def _find_split_file(folder: Path, split: str, lang: str) -> Path:
    for candidate in (folder / f"{split}.{lang}", folder / f"{split}.{lang}.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no file for split {split!r}, language {lang!r} in {folder}: expected {split}.{lang}[.gz]"
    )


def _text_lines(path: Path) -> list[str]:
    """The lines of a text file (`.gz` read compressed), through `datasets`' text loader (cached)."""
    if path.stat().st_size == 0:
        return []
    return load_dataset("text", data_files={"train": str(path)}, split="train")["text"]


def read_parallel_split(folder: str | Path, split: str, src_lang: str, tgt_lang: str) -> Dataset:
    """Read `{split}.{src_lang}[.gz]` and `{split}.{tgt_lang}[.gz]` (aligned line by line) as a `translation`
    Dataset."""
    folder = Path(folder)
    source = _text_lines(_find_split_file(folder, split, src_lang))
    target = _text_lines(_find_split_file(folder, split, tgt_lang))
    if len(source) != len(target):
        raise ValueError(
            f"split {split!r} of {folder}: {len(source)} {src_lang} lines but {len(target)} {tgt_lang} lines; "
            "the files must be aligned line by line."
        )
    if not source:
        raise ValueError(f"split {split!r} of {folder} is empty.")
    pairs = [{src_lang: s, tgt_lang: t} for s, t in zip(source, target, strict=True)]
    return Dataset.from_dict({"translation": pairs})


def _read_jsonl(path: Path, src_lang: str, tgt_lang: str) -> Dataset:
    """A JSON-lines file of `{"translation": {src: ..., tgt: ...}}` or `{src: ..., tgt: ...}` records, through
    `datasets`' JSON loader (cached)."""
    if path.stat().st_size == 0:
        raise ValueError(f"{path} holds no sentence pairs.")
    records = load_dataset("json", data_files={"train": str(path)}, split="train")
    rows = records["translation"] if "translation" in records.column_names else records.to_list()
    pairs = []
    for number, record in enumerate(rows, 1):
        if not isinstance(record, dict) or not isinstance(record.get(src_lang), str) or \
                not isinstance(record.get(tgt_lang), str):
            raise ValueError(f"{path}: record {number} has no {src_lang!r}/{tgt_lang!r} text fields: "
                             f"{str(record)[:200]}")
        pairs.append({src_lang: record[src_lang], tgt_lang: record[tgt_lang]})
    if not pairs:
        raise ValueError(f"{path} holds no sentence pairs.")
    return Dataset.from_dict({"translation": pairs})


def load_parallel_corpus(
    source: str | Path, src_lang: str, tgt_lang: str, splits: dict[str, str], hub_config: str | None = None
) -> DatasetDict:
    """
    Load a parallel corpus.

    Args:
        source: a folder of `{split}.{lang}[.gz]` files, a folder of `{split}.jsonl` files, a `.jsonl` file (used
            for the train split) or a Hub dataset id (needs network access).
        src_lang, tgt_lang: language codes, e.g. `"en"`, `"de"`.
        splits: our split name → the corpus' split name, e.g. `{"train": "train", "validation": "val",
            "test": "test_2016_flickr"}`; a split mapped to `None` is skipped.
        hub_config: the Hub dataset's configuration name (e.g. `"de-en"` for `wmt16`), if it has several.

    Returns:
        `DatasetDict` with a `translation` column per split.
    """
    wanted = {name: corpus_split for name, corpus_split in splits.items() if corpus_split}
    path = Path(source)
    if path.is_dir():
        def read(corpus_split):
            jsonl = path / f"{corpus_split}.jsonl"
            if jsonl.is_file():
                return _read_jsonl(jsonl, src_lang, tgt_lang)
            return read_parallel_split(path, corpus_split, src_lang, tgt_lang)

        return DatasetDict({name: read(corpus_split) for name, corpus_split in wanted.items()})
    if path.suffix == ".jsonl":
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {path} does not exist.")
        return DatasetDict({"train": _read_jsonl(path, src_lang, tgt_lang)})
    if path.exists() or str(source).startswith((".", "/")):
        raise FileNotFoundError(f"corpus {source} is neither a folder of split files nor a .jsonl file.")
    hub = load_dataset(str(source), hub_config)
    return DatasetDict({name: hub[corpus_split] for name, corpus_split in wanted.items()})
