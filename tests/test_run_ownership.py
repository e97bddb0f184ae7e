"""A run owns its folders (a second run into a used `output_dir` is refused unless it resumes or overwrites, two runs
never share one at once, averaging reads the run's own checkpoints), and the package leaves no process behind (the
forked spaCy parse process ends with its parent, also inside a user's `Dataset.map(..., num_proc=2)`)."""

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import MULTI30K_DIR

from mgsa_hf import MgsaProcessor, syntax_parser
from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.ownership import run_folder
from mgsa_hf.training.run import train


REPO = Path(__file__).resolve().parents[1]
DATA = MULTI30K_DIR
TINY = REPO / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"
SOURCE_PATH = str(REPO / "src")

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(output_dir, *overrides):
    return load_train_config(TINY, [f"data={DATA}", f"output_dir={output_dir}", "training.eval_strategy=no",
                                    *overrides])


def python(code: str, *args: str, **kwargs) -> subprocess.Popen:
    """A Python child running `code` with this checkout's package."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SOURCE_PATH, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env, text=True, **kwargs)


@pytest.mark.parametrize("left", ["model", "checkpoints", "results"])
def test_a_second_run_into_a_used_output_dir_is_refused_before_any_work(tmp_path, left):
    """What an earlier run left (its model in `output_dir`, checkpoints or results in the run folder) stops a new run
    before it trains its tokenizer, naming the folder and the ways on; nothing of the earlier run is touched."""
    output_dir, run_dir = tmp_path / "model", run_folder(tmp_path / "model")
    leftover = {"model": output_dir / "config.json", "results": run_dir / "results.json",
                "checkpoints": run_dir / "checkpoints" / "checkpoint-4" / "model.safetensors"}[left]
    leftover.parent.mkdir(parents=True)
    leftover.write_text("{}")
    with pytest.raises(FileExistsError, match="holds another run") as caught:
        train(tiny_config(output_dir, "training.max_steps=1"))
    message = str(caught.value)
    shown = run_dir / "checkpoints" if left == "checkpoints" else leftover
    assert f"output_dir={str(output_dir)!r}" in message and str(shown) in message
    assert "resume_from_checkpoint=true" in message and "overwrite_output_dir=true" in message
    assert leftover.read_text() == "{}" and not (run_dir / "tokenizer").exists()


def test_resume_averages_its_own_checkpoints_and_overwrite_replaces_the_run(tmp_path):
    """A run resumed from checkpoint-2 of a run that went on to checkpoint-6 averages checkpoint-2 and its own
    checkpoint-4, not the left course's checkpoint-6; `overwrite_output_dir=true` removes the earlier run's model and
    run files first, so that the new run's checkpoints and results are all that the folders hold (a file of the
    user's in the model folder is kept)."""
    checkpoints = run_folder(tmp_path) / "checkpoints"
    train(tiny_config(tmp_path, "training.max_steps=6"))
    assert sorted(path.name for path in checkpoints.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]

    results, _ = train(tiny_config(tmp_path, "training.max_steps=4", "average_last_checkpoints=3",
                                   f"resume_from_checkpoint={checkpoints / 'checkpoint-2'}"))
    assert results["averaging"]["checkpoints"] == ["checkpoint-2", "checkpoint-4"]

    (tmp_path / "stale.bin").write_text("from the earlier model folder")
    results, _ = train(tiny_config(tmp_path, "training.max_steps=2", "overwrite_output_dir=true"))
    assert sorted(path.name for path in checkpoints.iterdir()) == ["checkpoint-2"]
    assert json.loads((run_folder(tmp_path) / "results.json").read_text())["global_step"] == 2
    assert (tmp_path / "stale.bin").read_text() == "from the earlier model folder"
    assert (tmp_path / "config.json").is_file()
    with pytest.raises(ValueError, match="overwrite_output_dir=true removes the checkpoints"):
        train(tiny_config(tmp_path, "overwrite_output_dir=true", "resume_from_checkpoint=true"))


def test_a_run_folder_in_use_refuses_a_second_run(tmp_path):
    """While another process holds the run folder, a run into it stops at once, naming the folder and the holder; the
    folder is free again when the holder ends."""
    holder = python(f"""
        import importlib.util, sys

        # the module alone, without the package's imports (Transformers): the holder starts in a moment
        spec = importlib.util.spec_from_file_location("run_ownership", "{SOURCE_PATH}/mgsa_hf/training/ownership.py")
        run_ownership = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(run_ownership)
        with run_ownership.own_run_folders(sys.argv[1]):
            print("held", flush=True)
            sys.stdin.read()
    """, str(tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FileExistsError, match="in use by another run") as caught:
            train(tiny_config(tmp_path, "training.max_steps=1"))
        assert str(run_folder(tmp_path)) in str(caught.value)
        assert f"process {holder.pid} on {socket.gethostname()}" in str(caught.value)
    finally:
        holder.communicate("", timeout=60)
    from mgsa_hf.training.ownership import own_run_folders

    with own_run_folders(tmp_path) as claim:
        assert claim.checkpoints(run_folder(tmp_path) / "checkpoints") == []


def test_a_symbolic_link_to_a_used_output_dir_names_the_same_run(tmp_path):
    """`output_dir=link` (a symbolic link to `real`) while a run holds `real`: one run folder and one lock, so the
    second run is refused (both ran, each in its own run folder, one model folder holding the other's model)."""
    from mgsa_hf.training.ownership import own_run_folders

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    assert run_folder(tmp_path / "link") == run_folder(tmp_path / "real") == tmp_path.resolve() / "real-run"
    with own_run_folders(tmp_path / "real"):
        with pytest.raises(FileExistsError, match="in use by another run") as caught:
            with own_run_folders(tmp_path / "link"):
                pass
        assert str(tmp_path.resolve() / "real-run") in str(caught.value)
    assert not (tmp_path / "link-run").exists()
    with own_run_folders(tmp_path / "link"):  # free again once the first ends
        pass


def test_a_killed_tokenizer_save_does_not_block_the_next_run(tmp_path):
    """A run killed while saving its tokenizer leaves `.tokenizer.saving-<pid>-<random>` (and its preparation's
    records) in the run folder: the next run starts; they blocked every rerun with "holds another run". A checkpoint
    beside them still counts as a run."""
    from mgsa_hf.atomic_saves import STAGING_MARK
    from mgsa_hf.training.ownership import own_run_folders

    run_dir = run_folder(tmp_path / "model")
    for name in (f".tokenizer{STAGING_MARK}4194303-0a1b2c3d", f".tokenizer{STAGING_MARK}4194303-0a1b2c3d-old"):
        (run_dir / name).mkdir(parents=True)
        (run_dir / name / "tokenizer.json").write_text("{}")
    (run_dir / "tokenizer.building").write_text("{}")
    (run_dir / "tokenizer.building.4194303.partial").write_text("{")
    with own_run_folders(tmp_path / "model"):
        pass
    (run_dir / "checkpoints").mkdir()
    with pytest.raises(FileExistsError, match="holds another run"):
        with own_run_folders(tmp_path / "model"):
            pass


def _still_running(pids: list[int], timeout: float) -> list[int]:
    """The processes of `pids` still running (not a zombie) after up to `timeout` seconds, which are then killed (a
    failing test leaves none behind either)."""
    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    running = []
    for process in alive:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                running.append(process.pid)
                process.kill()
        except psutil.NoSuchProcess:
            pass
    return running


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked on Linux only")


@linux_only
def test_a_killed_parent_leaves_no_parse_process(multi30k_train_sources, monkeypatch):
    """The parent killed (SIGKILL) while its parse process is mid-batch: the parse process ends too, and with it the
    last holder of the parent's standard output, so a reader of that output (`... | cat`) sees its end. The parent is
    a fork of this process, its standard output a pipe read here."""
    monkeypatch.setattr(syntax_parser, "usable_cores", lambda: 2)
    parser = syntax_parser.SyntaxParser()
    assert parser.nlp is not None  # loaded here, inherited by the parent
    output, output_end = os.pipe()
    parent = os.fork()
    if parent == 0:  # the parent: parses on its parse process, writing to the pipe as its standard output
        try:
            os.close(output)
            os.dup2(output_end, 1)
            parsed = parser.pipe(multi30k_train_sources * 4, batch_size=8)
            next(parsed)
            os.write(1, f"{parser._parse_process._process.pid}\n".encode())
            time.sleep(120)
        finally:
            os._exit(0)
    os.close(output_end)
    with os.fdopen(output) as reader:
        try:
            child = int(reader.readline())
            assert psutil.Process(child).ppid() == parent
        finally:
            os.kill(parent, signal.SIGKILL)
            os.waitpid(parent, 0)
        assert _still_running([child], timeout=15) == []
        assert reader.read() == ""  # the end of the pipe: no process holds its writing end


_USER_SCRIPT = {}  # what a user's script holds at module level (its processor), which each map worker inherits


def _user_processor_call(batch):
    return dict(_USER_SCRIPT["processor"](batch["en"]))


@linux_only
def test_a_users_dataset_map_with_num_proc_leaves_no_process(multi30k_processor, multi30k_train_sources, monkeypatch):
    """A user's `Dataset.map(processor call, num_proc=2)`, the processor a module-level object of the user's script:
    each worker forks a parse process for its long batch, and ends without closing it (`os._exit`); none is left once
    `map` returns. This process is a subreaper meanwhile, so that a process left by a worker becomes its child, where
    it is found."""
    from datasets import Dataset

    monkeypatch.setattr(syntax_parser, "usable_cores", lambda: 2)
    monkeypatch.setitem(_USER_SCRIPT, "processor", MgsaProcessor(multi30k_processor.tokenizer, parser_batch_size=16))
    data = Dataset.from_dict({"en": multi30k_train_sources[:128]})
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    prctl, pr_set_child_subreaper = ctypes.CDLL(None, use_errno=True).prctl, 36
    prctl(pr_set_child_subreaper, 1)
    try:
        mapped = data.map(_user_processor_call, batched=True, batch_size=64, num_proc=2)
        left = [child.pid for child in psutil.Process().children(recursive=True) if child.pid not in before]
        running = _still_running(left, timeout=15)
    finally:
        prctl(pr_set_child_subreaper, 0)
    assert len(mapped) == 128 and "phrase_ids" in mapped.column_names
    assert running == []
