"""Saves that are visible whole or not at all.

Every save of the package (a model's and a processor's `save_pretrained`, the run's tokenizer, the model folder of
`mgsa-hf train`) writes into a new folder beside its target, `.<name>.saving-<pid>-<random>`, and swaps it in when
everything is written: on Linux in one atomic exchange of the two folders (`renameat2(RENAME_EXCHANGE)`), elsewhere by
renaming the old folder aside and the new one in. A save that stops (an error, a full disk, a killed process) leaves
the target as it was; the next save into it removes what a killed process left beside it.

The target's other files are kept: a save takes the place of the files it writes and of the files named by its
`replaces` patterns (a model's weights, configuration and `weights.sha256`; a processor's configuration and tokenizer
files), and every other file or folder of the target (a processor beside a model, a README, the user's own files) is
linked (or copied) into the new folder before the swap. So a sharded save leaves no stale `model.safetensors`, and a
model saved beside a processor keeps the processor.

Where the target cannot be replaced (it is a mount point, or its parent folder is not writable), the save is written
in place, as Transformers writes it, with a warning: such a save is not atomic.

The model's modules import this one (remote code copies it): standard library only.
"""

import contextlib
import ctypes
import errno
import fnmatch
import glob
import logging
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path


logger = logging.getLogger(__name__)

# what a save of each kind takes the place of in its target folder (the files it writes are replaced in any case)
MODEL_FILES = ("config.json", "generation_config.json", "model*.safetensors", "model*.safetensors.index.json",
               "pytorch_model*.bin", "pytorch_model*.bin.index.json", "weights.sha256")
PROCESSOR_FILES = ("processor_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json", "vocab.json", "*.spm",
                   "constituency_conversion.json.gz")
STAGING_MARK = ".saving-"
_RENAME_EXCHANGE = 2  # <linux/fs.h>
_AT_FDCWD = -100
_staging = set()  # the folders this process is writing a save into (a save nested in another writes there directly)


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` says the disk (or the user's quota) is full: an `OSError` with `ENOSPC`/`EDQUOT`, or a
    library's error whose text says so (safetensors' and torch's writers raise their own errors)."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return any(text in str(error) for text in ("No space left on device", "StorageFull", "Disk quota exceeded"))


def disk_full_error(error: BaseException, path: str | os.PathLike, what: str = "saving",
                    advice: str = "free space on its filesystem and save again") -> OSError:
    """An `OSError` (`ENOSPC`) naming the cause and `path`, for `error` raised by a write that ran out of space."""
    return OSError(errno.ENOSPC, f"No space left on device: {what} {path} stopped ({type(error).__name__}: {error}); "
                   f"{advice}", str(path))


def _exchange(first: Path, second: Path) -> bool:
    """Swap two folders in one atomic step (Linux's `renameat2(RENAME_EXCHANGE)`); False where it is not available
    (another system, an old kernel, a filesystem without it)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it
        return False
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, f"could not swap the new save {first} in for {second}: {os.strerror(code)}", str(second))


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _remove_leftovers(folder: Path) -> None:
    """Remove the staging folders of earlier saves into `folder` whose process is gone (a killed save)."""
    for path in folder.parent.glob(f".{glob.escape(folder.name)}{STAGING_MARK}*"):
        pid = path.name[len(folder.name) + len(STAGING_MARK) + 1:].partition("-")[0]
        if path.is_dir() and pid.isdigit() and not _process_alive(int(pid)):
            logger.warning("removing %s, left by a save into %s that did not finish", path, folder)
            shutil.rmtree(path, ignore_errors=True)


def _link_or_copy(source: Path, target: Path) -> None:
    """Put `source` (a file, a symbolic link or a folder) at `target`: files hard-linked where the filesystem allows,
    else copied (`shutil.copytree` calls it with strings)."""
    source, target = Path(source), Path(target)
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
    elif source.is_dir():
        shutil.copytree(source, target, symlinks=True, copy_function=_link_or_copy)
    else:
        try:
            os.link(source, target)
        except OSError as error:  # a filesystem without hard links, or across filesystems
            if is_disk_full(error):
                raise
            shutil.copy2(source, target)


def _replaceable(folder: Path) -> bool:
    return not (folder.is_dir() and os.path.ismount(folder)) and os.access(folder.parent, os.W_OK | os.X_OK)


@contextlib.contextmanager
def staged_folder(folder: str | os.PathLike, replaces: tuple[str, ...] = ()) -> Iterator[Path]:
    """Write a save into the returned folder; when the block ends without an error, it becomes `folder` whole.

    Args:
        folder (`str` or `os.PathLike`):
            The save's target, created if missing. A symbolic link to a folder saves into the folder it points to.
        replaces (`tuple[str]`):
            `fnmatch` patterns of the files of an earlier save in `folder` that this save takes the place of: they are
            not kept even where this save does not write them (a single-file model replaced by a sharded one).

    Yields:
        `Path`: an empty folder beside `folder` (or, nested in another save, `folder` itself).

    Raises:
        `OSError` (`ENOSPC`): naming "No space left on device" and `folder`, when a write ran out of space. Every
        error leaves `folder` as it was.
    """
    folder = Path(os.path.realpath(folder))
    if folder in _staging or folder.parent in _staging:  # written into a save under way, which swaps it in whole
        folder.mkdir(exist_ok=True)
        yield folder
        return
    if folder.is_file():
        raise NotADirectoryError(errno.ENOTDIR, f"cannot save into {folder}: it is a file, not a folder", str(folder))
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise disk_full_error(error, folder) if is_disk_full(error) else error from None
    if not _replaceable(folder):
        logger.warning("%s cannot be replaced whole (a mount point, or %s is not writable): saving in place, a save "
                       "that stops leaves it half-written", folder, folder.parent)
        folder.mkdir(exist_ok=True)
        for path in folder.iterdir():
            if any(fnmatch.fnmatch(path.name, pattern) for pattern in replaces) and path.is_file():
                path.unlink()
        try:
            yield folder
        except Exception as error:
            if is_disk_full(error):
                raise disk_full_error(error, folder) from error
            raise
        return
    _remove_leftovers(folder)
    staging = folder.with_name(f".{folder.name}{STAGING_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    _staging.add(staging)
    try:
        staging.mkdir()
        yield staging
        _keep_other_files(folder, staging, replaces)
        if not folder.exists():
            os.rename(staging, folder)
        elif not _exchange(staging, folder):  # not atomic: for a moment, `folder` is missing
            aside = staging.with_name(f"{staging.name}-old")
            os.rename(folder, aside)
            try:
                os.rename(staging, folder)
            except BaseException:
                os.rename(aside, folder)
                raise
            os.rename(aside, staging)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, Exception) and is_disk_full(error):
            raise disk_full_error(error, folder) from error
        raise
    finally:
        _staging.discard(staging)
    shutil.rmtree(staging, ignore_errors=True)  # the earlier save, swapped out


def _keep_other_files(folder: Path, staging: Path, replaces: tuple[str, ...]) -> None:
    """Give `staging` the permissions of `folder` (of a new folder, where there is none) and the files of `folder`
    that the save neither wrote nor replaces."""
    if not folder.is_dir():
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(staging, 0o777 & ~mask)
        return
    os.chmod(staging, folder.stat().st_mode & 0o7777)
    for path in folder.iterdir():
        replaced = path.is_file() and any(fnmatch.fnmatch(path.name, pattern) for pattern in replaces)
        if not replaced and not os.path.lexists(staging / path.name):
            _link_or_copy(path, staging / path.name)
