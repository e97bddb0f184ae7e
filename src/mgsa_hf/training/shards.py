"""The processed step of a prepared corpus ([`~mgsa_hf.training.corpus`]) made in shards, by several processes or
machines at once.

Shard `i` of `n` is the `i`-th contiguous `n`-th of every split (`datasets`' `Dataset.shard(n, i, contiguous=True)`).
The parse (`parsed-<key>`, for a model that reads syntax) and the tokens and fields (`processed-<key>`) are each made
shard by shard into `<folder>.shards/shard-<i>-of-<n>/`, with a record of its rows and of its files' sizes and
SHA-256s ([`~mgsa_hf.training.file_records`]). The process that writes the last record joins them: it checks every
shard's files against its record, lists them in shard order in the folder's `prepared.json` and renames the folder
to the one an unsharded preparation writes. The process making shard `i` announces itself in
`<folder>.shard-<i>-of-<n>.building` ([`~mgsa_hf.training.builders.building`]): a process waiting for the shards
([`wait_for_shards`]) stops with an error naming a shard's builder that died, or the error of one that failed. Read
back ([`load_listed`]), the shards concatenate to exactly the rows
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

from .builders import building, remove_dead_staging, staging_folder
from .builders import wait_for as wait_for_builder
from .file_records import CHECKSUMS, check_files, record_files


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


def shard_announcement(folder: Path, index: int, count: int) -> Path:
    """`<folder>.shard-<i>-of-<n>`: the name under which the builder of a shard of `folder` announces itself and
    leaves its error (`.building`, `.failed` after it)."""
    return folder.with_name(f"{folder.name}.shard-{index}-of-{count}")


def build_shard(folder: Path, shard: tuple[int, int], build) -> bool:
    """Make shard `shard = (i, n)` of `folder` (a prepared step's folder) with `build(staging, cut)`, which writes
    that step into `staging` for the `DatasetDict`s it passes through `cut` (their shard `i` of `n`) and returns its
    record (`rows`, `files` by split), unless `folder` or that shard is there already; then join the shards if all
    are there ([`join_shards`]). The builder announces itself while it works ([`shard_announcement`]); staging
    folders of shard builds whose process has ended are removed first.

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
    with building(shard_announcement(folder, index, count)):  # a failure (of the join too) ends the others' wait
        if not record.is_file():
            _build_shard(shards, name, build, cut)
        return join_shards(folder, count)


def _build_shard(shards: Path, name: str, build, cut) -> None:
    """Build shard `name` into `shards/name` and write its record `shards/name.json` (see [`build_shard`])."""
    shards.mkdir(parents=True, exist_ok=True)
    remove_dead_staging(shards / name)
    staging = staging_folder(shards / name)
    shutil.rmtree(staging, ignore_errors=True)
    started = time.perf_counter()
    try:
        written = build(staging, cut)
        checksums = record_files(staging)
        shutil.rmtree(shards / name, ignore_errors=True)
        os.replace(staging, shards / name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    written = {**written, "files": {split: [f"{name}/{file}" for file in files]
                                    for split, files in written["files"].items()},
               CHECKSUMS: {f"{name}/{file}": sizes for file, sizes in checksums.items()},
               "seconds": round(time.perf_counter() - started, 1)}
    (shards / f"{name}.json").write_text(json.dumps(written, indent=2) + "\n", encoding="utf-8")
    logger.info("%s of %s prepared in %.0f s", name, shards.name, written["seconds"])


def check_prepared(folder: Path, record: str = MARKER) -> dict:
    """The record `record` of a prepared folder (its `prepared.json`, or a shard's record), every file it records
    checked first: present, of its size and SHA-256 ([`~mgsa_hf.training.file_records.check_files`]).

    Raises:
        `ValueError` naming the file that is missing, cut short or damaged, or a record that is not JSON.
    """
    path = folder / record
    try:
        written = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"{path} cannot be read ({error}): the record of the prepared folder {folder} was damaged. "
                         "Remove the folder and prepare it again.") from None
    listed = [name for names in written.get("files", {}).values() for name in names]
    check_files(folder, written, path, names=sorted({*written.get(CHECKSUMS, {}), *listed}))
    return written


def load_listed(folder: Path, record: str = MARKER):
    """The splits a prepared step's record lists (`record` in `folder`: the step's `prepared.json`, or a shard's
    record), memory-mapped: a `DatasetDict` of its Arrow files, a split's files concatenated in order, each checked
    against the record first ([`check_prepared`])."""
    from datasets import Dataset, DatasetDict, concatenate_datasets

    files = check_prepared(folder, record)["files"]
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
    parts = [check_prepared(shards, record.name) for record in records]  # a shard damaged since it was made
    splits = list(parts[0]["files"])
    joined = {**parts[0], "shards": count,
              "rows": {split: sum(part["rows"][split] for part in parts) for split in splits},
              "files": {split: [file for part in parts for file in part["files"][split]] for split in splits},
              "seconds": round(sum(part["seconds"] for part in parts), 1)}
    if all(CHECKSUMS in part for part in parts):
        joined[CHECKSUMS] = {name: sizes for part in parts for name, sizes in part[CHECKSUMS].items()}
    else:  # shards made before the record: the folder is not checked
        joined.pop(CHECKSUMS, None)
    (shards / MARKER).write_text(json.dumps(joined, indent=2) + "\n", encoding="utf-8")
    try:
        os.rename(shards, folder)
    except OSError:  # another process joined them first (or an unsharded build finished): it must be complete
        if not (folder / MARKER).is_file():
            raise
    logger.info("%d shards of %s joined", count, folder.name)
    return True


def wait_for_shards(folder: Path, count: int, what: str, poll_seconds: float, report_seconds: float) -> None:
    """Wait, looking at the disk every `poll_seconds`, until the `count` shards of `folder` are made and joined; say
    so every `report_seconds`.

    Raises:
        `RuntimeError` with a shard's error when its build failed, or naming the host and process of a shard's
        builder that ended without finishing it (see [`~mgsa_hf.training.builders.wait_for`]).
    """
    shards = shards_folder(folder)

    def missing() -> list[tuple[Path, str]]:
        return [(shard_announcement(folder, index, count), f"shard {index} of {count} of {what}")
                for index in range(count) if not (shards / f"shard-{index}-of-{count}.json").is_file()]

    logger.warning("waiting for the other processes to prepare their shards of %s (%s)", what, folder)
    wait_for_builder(folder, what, lambda: (folder / MARKER).is_file(), poll_seconds, report_seconds,
                     " Every shard I of N is made by a process of the launch, or a job `mgsa-hf prepare --shard I/N`.",
                     builders=missing, builder="the shard's process")


def launch_shard(config) -> tuple[int, int] | None:
    """This process's shard of the processed step under `accelerate launch` when the recipe says
    `prepare_in_shards: true` (global rank, number of processes); None otherwise."""
    if not getattr(config, "prepare_in_shards", False):
        return None
    from accelerate import PartialState

    state = PartialState()
    return (state.process_index, state.num_processes) if state.num_processes > 1 else None


__all__ = ["build_shard", "check_prepared", "join_shards", "launch_shard", "load_listed", "parse_shard",
           "shard_announcement", "shard_splits", "shards_folder", "wait_for_shards"]
