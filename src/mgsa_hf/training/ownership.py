"""A training run's claim on its folders: the model folder `output_dir` and the run folder beside it ([`run_folder`]).

A run holds the run folder's lock (`run.lock`, with its holder's process id, host and start time in `run.lock.json`)
from before its first piece of work to its end, so two runs never write into one folder at once; and it starts only
where no other run has left its files, unless it resumes that run (`resume_from_checkpoint`) or is told to replace it
(`overwrite_output_dir`), which removes the earlier run's files first. Checkpoint averaging then reads only the run's
own checkpoints ([`RunClaim.checkpoints`]). Replacing a run's model folder removes the files a run writes there
([`model_folder_files`]), not the folder's other files.

The commands that write a folder of their own (`mgsa-hf convert`, `export onnx`, `export ct2`) refuse one that holds
files unless told to replace them (`--overwrite`), and never write into the folder they read ([`check_output_folder`]).
"""

import fnmatch
import json
import os
import re
import shutil
import socket
from contextlib import contextmanager
from pathlib import Path


LOCK_FILE = "run.lock"
HOLDER_FILE = "run.lock.json"
# what `mgsa-hf prepare` (or a run's preparation) leaves in the run folder: the corpus prepared on disk and the run's
# tokenizer, each named or recorded by what it holds; they are not a run of their own, and a new run reuses them
PREPARATION = ("prepared", "tokenizer", "prepared.failed", "tokenizer.failed", "tokenizer.building")
_KEPT = (LOCK_FILE, HOLDER_FILE, *PREPARATION)
# the mark of a save's staging folder (`atomic_saves.STAGING_MARK`; this module imports nothing of the package)
_SAVING = ".saving-"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model_fsdp_0/.metadata")
OVERWRITE_OPTION = "--overwrite"


def check_output_folder(output_dir: str | Path, source: str | Path | None = None, overwrite: bool = False,
                        option: str = OVERWRITE_OPTION) -> None:
    """
    Refuse to write `output_dir` where the write would lose something without a word: into the folder `source` that
    is read (or a folder holding it), always; into a folder that holds files, unless `overwrite`.

    Args:
        output_dir (`str` or `Path`): the folder a command writes.
        source (`str` or `Path`, *optional*): the folder (or Hub id) it reads.
        overwrite (`bool`): whether the command may replace what `output_dir` holds.
        option (`str`): how the user says `overwrite`, named in the error.

    Raises:
        `ValueError`: `output_dir` is `source` or holds it.
        `FileExistsError`: `output_dir` is a file, or a folder holding files, without `overwrite`.
    """
    output = Path(output_dir).expanduser()
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"{output_dir} is a file, not a folder: not replaced. Name a folder to write.")
    if source is not None and Path(source).expanduser().exists():
        read, written = Path(source).expanduser().resolve(), output.resolve()
        if read == written or read.is_relative_to(written):
            where = "is" if read == written else "holds"
            raise ValueError(f"the output folder {output_dir} {where} the folder read, {source}: writing it would "
                             f"replace what is read while it is read. Name another output folder.")
    if output.is_dir() and not overwrite:
        held = sorted(path.name for path in output.iterdir())
        if held:
            shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
            raise FileExistsError(f"{output_dir} is not empty (it holds {shown}): not replaced. Name another folder, "
                                  f"or pass {option} to replace what it holds (its files that the command does not "
                                  "write are kept).")


def model_folder_patterns() -> tuple[str, ...]:
    """`fnmatch` patterns of the files a model folder's save writes: the model's and the processor's files, the model
    card and the package's code files that `save_pretrained` copies beside the model. A file of the user's (notes,
    another tool's output) matches none."""
    from .. import atomic_saves

    code = sorted(path.name for path in Path(atomic_saves.__file__).parent.glob("*.py") if path.name != "__init__.py")
    return (*atomic_saves.MODEL_FILES, *atomic_saves.PROCESSOR_FILES, "README.md", *code)


def model_folder_files(folder: Path) -> list[Path]:
    """The files of `folder` that saving a run's model folder writes ([`model_folder_patterns`]), which replacing
    the run removes."""
    patterns = model_folder_patterns()
    return sorted(path for path in folder.iterdir()
                  if path.is_file() and any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns))


def run_folder(output_dir: str | Path) -> Path:
    """
    The folder beside the model folder `output_dir` where a run keeps what is not part of the model: `checkpoints/`
    (what `resume_from_checkpoint` reads), `tokenizer/` (the joint vocabulary trained for the run), `results.json`
    and `<split>.hyp.<target_lang>`, the translations the scores were computed from. `runs/mgsa-multi30k` →
    `<cwd>/runs/mgsa-multi30k-run`. It is taken beside the folder's real path, so every name of one model folder (a
    symbolic link to it, a relative path) names one run folder and one lock.
    """
    output_dir = Path(output_dir).resolve()  # one run folder (and lock) for every name of the model folder
    return output_dir.with_name(f"{output_dir.name}-run")


def _kept(name: str) -> bool:
    """Whether an entry of the run folder is the lock or the preparation, or what a preparation stopped while saving
    left beside it (a `.tokenizer.saving-*` folder, a record half-written): no run of its own."""
    return name in _KEPT or any(name.startswith(f".{kept}{_SAVING}") or name.startswith(f"{kept}.")
                                for kept in PREPARATION)


def complete_checkpoints(folder: Path) -> list[Path]:
    """The `checkpoint-<step>` folders in `folder` that hold the model's weights, by step: in safetensors, or in the
    shards that FSDP's `SHARDED_STATE_DICT` leaves instead (accelerate's `pytorch_model_fsdp_0/`, a
    torch.distributed.checkpoint folder, complete once its `.metadata` is written)."""
    found = [path for path in Path(folder).glob("checkpoint-*")
             if _CHECKPOINT.match(path.name) and any((path / name).is_file() for name in _WEIGHTS)]
    return sorted(found, key=_step)


def _step(checkpoint: Path) -> int:
    return int(_CHECKPOINT.match(checkpoint.name).group(1))


def _saved_at(checkpoint: Path) -> float:
    """When the Trainer finished writing `checkpoint` (its `trainer_state.json`, written with the checkpoint)."""
    state = checkpoint / "trainer_state.json"
    return (state if state.is_file() else checkpoint).stat().st_mtime


class RunClaim:
    """
    A run's hold on its folders, from [`own_run_folders`].

    Args:
        started (`float`): when the run took its folders, on the file system's clock (the holder record's time).
        resumed_step (`int`, *optional*): the step of the run-folder checkpoint the run continues from.
        lock (`filelock.FileLock`, *optional*): the held lock (the main process's claim only).
    """

    def __init__(self, started: float, resumed_step: int | None = None, lock=None, holder: Path | None = None):
        self.started, self.resumed_step, self._lock, self._holder = started, resumed_step, lock, holder

    def checkpoints(self, folder: str | Path) -> list[Path]:
        """The complete checkpoints in `folder` that are this run's, by step: those saved since it started and, for a
        resumed run, those up to the step it continued from (its history). A checkpoint of a later step saved before
        the run started belongs to a course the resumed run left, and is not read."""
        return [path for path in complete_checkpoints(Path(folder))
                if _saved_at(path) >= self.started
                or (self.resumed_step is not None and _step(path) <= self.resumed_step)]

    def release(self) -> None:
        """Give the folders up (the holder record goes, then the lock)."""
        if self._lock is not None:
            if self._holder is not None:
                self._holder.unlink(missing_ok=True)
            self._lock.release()
            self._lock = None


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _describe_holder(run_dir: Path) -> str:
    """Who holds the run folder's lock, as its holder record says."""
    try:
        holder = json.loads((run_dir / HOLDER_FILE).read_text())
        pid, host = int(holder["pid"]), str(holder["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder left no record"
    described = f"process {pid} on {host}, started {holder.get('started_at', '?')}"
    if host == socket.gethostname() and not _alive(pid):
        described += "; that process has ended, so a process it started still holds the lock"
    return described


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def earlier_run(output_dir: Path, run_dir: Path) -> list[str]:
    """What an earlier run left in the folders: a model in `output_dir` (its `config.json`), and every entry of the run
    folder but the lock and the preparation ([`PREPARATION`]): checkpoints, results, translations. Empty when the
    folders hold no run."""
    found = [str(output_dir / "config.json")] if (output_dir / "config.json").is_file() else []
    if run_dir.is_dir():
        found += sorted(str(path) for path in run_dir.iterdir() if not _kept(path.name))
    return found


def _check_overwrite(output_dir: Path, run_dir: Path, resume, keep: dict) -> None:
    """`overwrite_output_dir` removes both folders: nothing the run reads may lie in them."""
    if resume is True or (isinstance(resume, str) and resume and _inside(Path(resume), run_dir)):
        raise ValueError(f"overwrite_output_dir=true removes the checkpoints in {run_dir} that "
                         f"resume_from_checkpoint={resume!r} resumes from: set one of the two.")
    for key, value in keep.items():
        if isinstance(value, str) and value and Path(value).exists() and (
                _inside(Path(value), output_dir) or _inside(Path(value), run_dir)):
            raise ValueError(f"overwrite_output_dir=true removes {output_dir} and {run_dir}, which hold "
                             f"{key}={value!r}: copy it elsewhere first, or train into another `output_dir`.")
    if _inside(Path.cwd(), output_dir):
        raise ValueError(f"overwrite_output_dir=true would remove {output_dir}, which holds the working directory: "
                         "name another `output_dir`.")


def _take(output_dir: Path, overwrite: bool, resume, keep: dict) -> RunClaim:
    """The main process's claim: the lock, then the check (and, with `overwrite`, the removal) of the earlier run."""
    from datetime import datetime, timezone

    from filelock import FileLock, Timeout

    output_dir = output_dir.resolve()
    run_dir = run_folder(output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(run_dir / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise FileExistsError(f"{run_dir} is in use by another run ({_describe_holder(run_dir)}): wait for it to end, "
                              "or train into another `output_dir`.") from None
    try:
        earlier = earlier_run(output_dir, run_dir)
        resumes_here = resume is True or (isinstance(resume, str) and bool(resume) and _inside(Path(resume), run_dir))
        if earlier and overwrite:
            _check_overwrite(output_dir, run_dir, resume, keep)
            if (output_dir / "config.json").is_file():  # the earlier run's files only: the user's are kept
                for path in model_folder_files(output_dir):
                    path.unlink()
                if not any(output_dir.iterdir()):
                    output_dir.rmdir()
            for path in run_dir.iterdir():
                if _kept(path.name):
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        elif earlier and not resumes_here:
            shown = ", ".join(earlier[:4]) + (f" and {len(earlier) - 4} more" if len(earlier) > 4 else "")
            raise FileExistsError(
                f"output_dir={str(output_dir)!r} holds another run ({shown}): a new run there would replace its model "
                "and mix with its checkpoints. Train into another `output_dir`, continue that run with "
                f"`resume_from_checkpoint=true`, or replace it with `overwrite_output_dir=true` (which first removes "
                f"the model files in {output_dir} and the contents of {run_dir} but the prepared corpus and "
                "tokenizer)."
            )
        resumed_step = None
        if resume is True:
            existing = complete_checkpoints(run_dir / "checkpoints")
            resumed_step = _step(existing[-1]) if existing else None
        elif resumes_here and _CHECKPOINT.match(Path(resume).name):
            resumed_step = _step(Path(resume))
        holder = run_dir / HOLDER_FILE
        holder.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                      "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}) + "\n")
        return RunClaim(holder.stat().st_mtime, resumed_step, lock, holder)
    except BaseException:
        lock.release()
        raise


@contextmanager
def own_run_folders(output_dir: str | Path, overwrite: bool = False, resume=None, keep: dict | None = None,
                    process_index: int = 0, world_size: int = 1):
    """
    Hold the folders of a run into `output_dir` for the duration of the `with` block; yields its [`RunClaim`].

    The main process (`process_index` 0) takes the run folder's lock and checks the folders; under `accelerate launch`
    (`world_size` > 1) the others wait for its answer and raise its error with it.

    Args:
        output_dir (`str` or `Path`): the run's model folder.
        overwrite (`bool`): remove an earlier run's files (the model folder and the run folder's contents) first.
        resume (`bool` or `str`, *optional*): the run's `resume_from_checkpoint`; resuming from the run folder's
            checkpoints continues the run those folders hold.
        keep (`dict`, *optional*): the folders the run reads (`{"tokenizer": ..., "init_from": ...}`), which
            `overwrite` may not remove.

    Raises:
        `FileExistsError`: another run holds the lock (naming its process and host), or the folders hold an earlier run
        and the run neither resumes nor overwrites it.
        `ValueError`: `overwrite_output_dir` is no boolean, or would remove what the run reads.
    """
    output_dir = Path(output_dir)
    claim, error = None, None
    if process_index == 0:
        try:
            if not isinstance(overwrite, bool):
                raise ValueError(f"`overwrite_output_dir` must be true or false, got {overwrite!r}.")
            claim = _take(output_dir, overwrite, resume, keep or {})
        except Exception as caught:  # handed to the other processes before it is raised
            error = caught
    if world_size > 1:
        from accelerate.utils import broadcast_object_list

        message = [None if error is None else (type(error).__name__, str(error))]
        broadcast_object_list(message, from_process=0)
        if error is None and message[0] is not None:
            kinds = {"FileExistsError": FileExistsError, "ValueError": ValueError}
            error = kinds.get(message[0][0], RuntimeError)(message[0][1])
    if error is not None:
        raise error
    claim = claim or RunClaim(0.0)
    try:
        yield claim
    finally:
        claim.release()
