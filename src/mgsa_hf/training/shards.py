"""The processed step of a prepared corpus ([`~mgsa_hf.training.corpus`]) made in shards, by several processes or
machines at once.

Shard `i` of `n` is the `i`-th contiguous `n`-th of every split (`datasets`' `Dataset.shard(n, i, contiguous=True)`).
The parse (`parsed-<key>`, for a model that reads syntax) and the tokens and fields (`processed-<key>`) are each made
shard by shard into `<folder>.shards/shard-<i>-of-<n>/`, with a record of its rows. The process that writes the last
record joins them: it lists every shard's files in shard order in the folder's `prepared.json` and renames the folder
to the one an unsharded preparation writes. Read back ([`load_listed`]), the shards concatenate to exactly the rows
the unsharded step gives, in the same order, so the key is the same and a run cannot tell how its corpus was
prepared.

Two ways in:

* `prepare_in_shards: true` in a recipe: under `accelerate launch`, every process (global rank `i` of `n`) prepares
  shard `i` with its `num_proc` workers, instead of rank 0 alone while the others wait; `prepared_dir` must be a folder
  every machine reads and writes. The corpus step and the tokenizer stay with rank 0 (they read the text once).
* `mgsa-hf prepare --shard I/N` on a CPU cluster, one job a shard, each with the same recipe and `prepared_dir`; the
  last to finish joins them, and a run with that recipe and `prepared_dir` then finds the corpus ready.
"""

import json
import os
import shutil
import time
from pathlib import Path

from transformers.utils import logging


logger = logging.get_logger(__name__)

# written last into a prepared folder (a step, or a shard's joined folder): the folder is complete
MARKER = "prepared.json"


def parse_shard(text: str) -> tuple[int, int]:
    """`"I/N"` (shard I of N, counted from 0) as `(I, N)`; a `ValueError` saying what it takes otherwise."""
    index, sep, count = str(text).partition("/")
    try:
        index, count = int(index), int(count)
    except ValueError:
        index = count = -1
    if not sep or count < 1 or not 0 <= index < count:
        raise ValueError(f"--shard takes I/N, shard I of N counted from 0 (e.g. 0/8 ... 7/8), got {text!r}.")
    return index, count


def shards_folder(folder: Path) -> Path:
    """Where the shards of `folder` (a `processed-<key>` folder) are made."""
    return folder.with_name(folder.name + ".shards")


def build_shard(folder: Path, shard: tuple[int, int], build) -> bool:
    """Make shard `shard = (i, n)` of `folder` (a prepared step's folder) with `build(staging, cut)`, which writes
    that step into `staging` for the `DatasetDict`s it passes through `cut` (their shard `i` of `n`) and returns its
    record (`rows`, `files` by split), unless `folder` or that shard is there already; then join the shards if all
    are there ([`join_shards`]).

    Returns:
        Whether `folder` is complete.
    """
    from datasets import DatasetDict

    index, count = shard
    if (folder / MARKER).is_file():
        return True

    def cut(splits):
        return DatasetDict({split: data.shard(count, index, contiguous=True) for split, data in splits.items()})

    shards = shards_folder(folder)
    name = f"shard-{index}-of-{count}"
    record = shards / f"{name}.json"
    if not record.is_file():
        shards.mkdir(parents=True, exist_ok=True)
        staging = shards / f"{name}.staging-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        started = time.perf_counter()
        try:
            written = build(staging, cut)
            shutil.rmtree(shards / name, ignore_errors=True)
            os.replace(staging, shards / name)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        written = {**written, "files": {split: [f"{name}/{file}" for file in files]
                                        for split, files in written["files"].items()},
                   "seconds": round(time.perf_counter() - started, 1)}
        record.write_text(json.dumps(written, indent=2) + "\n", encoding="utf-8")
        logger.info("shard %d of %d of %s prepared in %.0f s", index, count, folder.name, written["seconds"])
    return join_shards(folder, count)


def load_listed(folder: Path, record: str = MARKER):
    """The splits a prepared step's record lists (`record` in `folder`: the step's `prepared.json`, or a shard's
    record), memory-mapped: a `DatasetDict` of its Arrow files, a split's files concatenated in order."""
    from datasets import Dataset, DatasetDict, concatenate_datasets

    files = json.loads((folder / record).read_text(encoding="utf-8"))["files"]
    splits = {}
    for split, names in files.items():
        parts = [Dataset.from_file(str(folder / name)) for name in names]
        splits[split] = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
    return DatasetDict(splits)


def shard_splits(folder: Path, shard: tuple[int, int]):
    """Shard `shard = (i, n)` of a step's splits, once this process has built it ([`build_shard`]): from its own files
    while the other shards are still being made, or, from a folder made whole, its part of each split."""
    from datasets import DatasetDict

    index, count = shard
    name = f"shard-{index}-of-{count}"
    base = folder if (folder / MARKER).is_file() else shards_folder(folder)
    if not (base / f"{name}.json").is_file():  # made whole (not in shards): its part
        return DatasetDict({split: data.shard(count, index, contiguous=True)
                            for split, data in load_listed(folder).items()})
    return load_listed(base, f"{name}.json")


def join_shards(folder: Path, count: int) -> bool:
    """When the records of all `count` shards of `folder` are there, write its `prepared.json` (the shards' files in
    order, their rows summed) and rename the shards' folder to `folder`. Two processes may both try: the one whose
    rename comes second finds `folder` complete.

    Returns:
        Whether `folder` is complete.
    """
    shards = shards_folder(folder)
    records = [shards / f"shard-{index}-of-{count}.json" for index in range(count)]
    if (folder / MARKER).is_file():
        return True
    if not all(record.is_file() for record in records):
        return False
    parts = [json.loads(record.read_text(encoding="utf-8")) for record in records]
    splits = list(parts[0]["files"])
    joined = {**parts[0], "shards": count,
              "rows": {split: sum(part["rows"][split] for part in parts) for split in splits},
              "files": {split: [file for part in parts for file in part["files"][split]] for split in splits},
              "seconds": round(sum(part["seconds"] for part in parts), 1)}
    (shards / MARKER).write_text(json.dumps(joined, indent=2) + "\n", encoding="utf-8")
    try:
        os.rename(shards, folder)
    except OSError:  # another process joined them first (or an unsharded build finished): it must be complete
        if not (folder / MARKER).is_file():
            raise
    logger.info("%d shards of %s joined", count, folder.name)
    return True


def launch_shard(config) -> tuple[int, int] | None:
    """This process's shard of the processed step under `accelerate launch` when the recipe says
    `prepare_in_shards: true` (global rank, number of processes); None otherwise."""
    if not getattr(config, "prepare_in_shards", False):
        return None
    from accelerate import PartialState

    state = PartialState()
    return (state.process_index, state.num_processes) if state.num_processes > 1 else None


__all__ = ["build_shard", "join_shards", "launch_shard", "load_listed", "parse_shard", "shard_splits",
           "shards_folder"]
