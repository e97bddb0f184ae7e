"""The size and SHA-256 of every file of a prepared folder, recorded when it is completed and checked when it is
loaded.

A prepared step ([`~mgsa_hf.training.corpus`]) records in its `prepared.json`, under `checksums`, each of its files
(relative to the folder) with its size and SHA-256; a shard's record does the same for its files, and the joined
folder lists them all. A load checks every file it reads: one that is missing, of another size (cut short) or with
other bytes (damaged) stops it with an error naming the file, not with what Arrow or the model then make of it. A
folder prepared before the record loads unchecked.

Cost: the size is read on every load. The SHA-256 (about a second a GB of one core, less than reading the files) is
read once a process for each file, memoised by the file's identity on disk ([`file_digest`]): a run that loads its
splits several times, or joins shards and then loads them, reads each file once.
"""

from pathlib import Path

from ..weights_checksums import file_sha256


# the key of a record (`prepared.json`, a shard's record) that holds its files' sizes and SHA-256s
CHECKSUMS = "checksums"

# the digests of the files read in this process, by their identity on disk: a file is read once a process
_DIGESTS: dict[tuple, str] = {}


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes (about a second a GB of one core). Kept for the process by the file's device,
    inode, size, modification and change times, not its path (a staging folder renamed into place keeps them): the
    change time (`st_ctime`) moves on every write and no copy tool restores it, so a file rewritten with its size and
    modification time restored is read again."""
    stat = path.stat()
    identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if identity not in _DIGESTS:
        _DIGESTS[identity] = file_sha256(path)
    return _DIGESTS[identity]


def record_files(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """Every file under `folder` but those named in `skip`, by its path relative to `folder` (with `/`): its size
    and SHA-256, sorted by path."""
    folder = Path(folder)
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    names = [path.relative_to(folder).as_posix() for path in files]
    return {name: {"size": path.stat().st_size, "sha256": file_digest(path)}
            for name, path in zip(names, files, strict=True) if name not in skip}


def check_files(folder: Path, record: dict, source: Path, names: list[str] | None = None, advice: str = "") -> None:
    """Check the files of `folder` against `record[CHECKSUMS]` (read from `source`, the record's file): every one, or
    those in `names` (which the record must hold). A record without checksums (a folder prepared before them) is not
    checked. `advice` ends the error (by default: remove the prepared folder and prepare it again).

    Raises:
        `ValueError` naming the first file that is missing, of another size, or with another SHA-256, or one of
        `names` that the record does not hold.
    """
    checksums = record.get(CHECKSUMS)
    if checksums is None:
        return
    advice = advice or (f"The prepared folder {folder} was damaged after it was written: remove it and prepare it "
                        "again (`mgsa-hf prepare` with the recipe, or start the run again).")
    for name in names if names is not None else checksums:
        path = folder / name
        if name not in checksums:
            raise ValueError(f"{path} is not in {source}, which records the prepared files: the record was changed "
                             f"by hand. {advice}")
        expected = checksums[name]
        if not path.is_file():
            raise ValueError(f"{path} is missing: {source} records it. {advice}")
        size = path.stat().st_size
        if size != expected["size"]:
            raise ValueError(f"{path} holds {size} bytes, {source} records {expected['size']} (a file cut short or "
                             f"overwritten). {advice}")
        actual = file_digest(path)
        if actual != expected["sha256"]:
            raise ValueError(f"{path} does not hold the bytes that were prepared: its SHA-256 is {actual}, {source} "
                             f"records {expected['sha256']}. {advice}")


__all__ = ["CHECKSUMS", "check_files", "file_digest", "record_files"]
