"""Saves stopped at every write they make: a killed process, a full disk.

Each test patches the functions a save writes through (`open` for writing, safetensors' and the tokenizers' writers,
renames, links, removals) so that the Nth call fails, for every N of the save, and checks what the folder then holds:
the save before it, whole, or an error naming the folder; never a mix of two saves.
"""

import builtins
import copy
import errno
import io
import json
import os
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import MULTI30K_DIR

from mgsa_hf import MgsaForConditionalGeneration, MgsaProcessor, MgsaT5ForConditionalGeneration


pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
MULTI30K = MULTI30K_DIR


class Killed(BaseException):
    """The process died at this write: no handler of the library runs (a `BaseException`, as `SystemExit`)."""


class FaultInjector:
    """Patches the functions saves write through; the `fail_at`-th call (1-based; calls made inside a patched call
    do not count) raises `error`. `kill=True`: every later call raises too, as nothing runs after a kill; else only
    the writers of data count (a full disk fails writes, not renames or removals)."""

    def __init__(self, monkeypatch, fail_at: int | None = None, error: BaseException | None = None,
                 kill: bool = True):
        import transformers.modeling_utils
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        import mgsa_hf.atomic_saves

        self.calls, self.fail_at, self.error, self.kill, self.failed = 0, fail_at, error, kill, False
        self.code_copies = []  # the calls that copy a module of the package (remote code), one like the other
        self._inside = False
        real_open = builtins.open

        def opener(file, mode="r", *args, **kwargs):
            if any(flag in mode for flag in "wax+"):
                return self._call(real_open, True, file, mode, *args, **kwargs)
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", opener)
        monkeypatch.setattr(io, "open", opener)
        writers = [(os, "link"), (os, "symlink"), (shutil, "copyfile"),
                   (transformers.modeling_utils, "safe_save_file"), (TokenizersBackend, "_save_pretrained")]
        others = [(os, "rename"), (os, "replace"), (os, "unlink"), (os, "remove"), (shutil, "rmtree"),
                  (mgsa_hf.atomic_saves, "_exchange")]
        self._copyfile = shutil.copyfile
        for owner, name in writers + others:
            monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name), (owner, name) in writers))

    def _wrap(self, real, writes: bool):
        def wrapper(*args, **kwargs):
            return self._call(real, writes, *args, **kwargs)

        return wrapper

    def _call(self, real, writes: bool, *args, **kwargs):
        if self._inside or not (writes or self.kill):
            return real(*args, **kwargs)
        self.calls += 1
        if real is self._copyfile and str(args[0]).endswith(".py"):
            self.code_copies.append(self.calls)
        if self.fail_at is not None and (self.calls == self.fail_at or (self.kill and self.failed)):
            self.failed = True
            raise self.error
        self._inside = True
        try:
            return real(*args, **kwargs)
        finally:
            self._inside = False


def write_points(monkeypatch, save, kill: bool = True) -> list[int]:
    """The calls of `save()` to fail, when nothing fails (`kill=False`: the writes of data): every one, but of the
    copies of the package's modules (a model's or processor's remote code, some twenty alike) the first and last."""
    with monkeypatch.context() as patch:
        injector = FaultInjector(patch, kill=kill)
        save()
    alike = set(injector.code_copies[1:-1])
    return [call for call in range(1, injector.calls + 1) if call not in alike]


def save_with_fault(monkeypatch, save, fail_at: int, fault: str, folder: Path) -> bool:
    """Run `save()` with its `fail_at`-th write failing (`fault`: "kill" or "full disk"); returns whether it failed.
    A full disk must raise an `OSError` naming the cause and `folder`."""
    error = Killed() if fault == "kill" else OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with monkeypatch.context() as patch:
        injector = FaultInjector(patch, fail_at, error, kill=fault == "kill")
        try:
            save()
        except Killed:
            return True
        except OSError as raised:
            assert fault == "full disk", raised
            assert raised.errno == errno.ENOSPC and "No space left on device" in str(raised), raised
            assert str(folder) in str(raised), raised
            return True
    return injector.failed


def model_state(model_class, folder):
    """What loading `folder` gives: `("refused", message)` or `(weights, label_smoothing, num_beams)`."""
    try:
        model = model_class.from_pretrained(folder)
    except (OSError, ValueError) as error:
        return "refused", str(error)
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    return weights, model.config.label_smoothing, model.generation_config.num_beams


def same_state(state, expected) -> bool:
    if state[0] == "refused" or expected[0] == "refused":
        return state == expected
    return (state[0].keys() == expected[0].keys() and all(torch.equal(state[0][k], expected[0][k]) for k in state[0])
            and state[1:] == expected[1:])


def check_left(state, before, after, folder, fault: str) -> None:
    """A stopped save leaves the save before it (or, killed after the swap, the new one), or an error naming
    `folder`."""
    if state[0] == "refused":
        assert str(folder) in state[1], state[1]
        return
    assert same_state(state, before) or (fault == "kill" and same_state(state, after)), "a mix of two saves"


@pytest.fixture(scope="module")
def small_processor(tmp_path_factory):
    """A processor without syntax around a 300-token vocabulary (another than `multi30k_processor`'s 600)."""
    from mgsa_hf.tokenization_utils import train_joint_tokenizer

    tokenizer = train_joint_tokenizer(MULTI30K / "train.en.gz", MULTI30K / "train.de.gz",
                                      tmp_path_factory.mktemp("small_tokenizer"), vocab_size=300, max_sentences=300)
    return MgsaProcessor(tokenizer, with_syntax=False)


def two_models(backbone, processor, tiny_config, tiny_t5_config):
    """Two models of one vocabulary that differ in weights, `label_smoothing` and the generation config's
    `num_beams`."""
    models = []
    for seed, smoothing, beams in ((0, 0.0, 1), (1, 0.1, 4)):
        torch.manual_seed(seed)
        if backbone == "marian":
            model = MgsaForConditionalGeneration(tiny_config(processor, "transformer", encoder_layers=1,
                                                             label_smoothing=smoothing))
        else:
            model = MgsaT5ForConditionalGeneration(tiny_t5_config(processor, "transformer", label_smoothing=smoothing))
        model.generation_config.num_beams = beams
        models.append(model)
    return models


@pytest.mark.parametrize(("backbone", "fault"), [("marian", "kill"), ("t5", "full disk")])
def test_model_save_stopped_at_each_write(multi30k_processor, tiny_config, tiny_t5_config, tmp_path, monkeypatch,
                                          backbone, fault):
    """A single-file save over which a sharded one is written (Marian) or another single-file one (T5), stopped at
    each write: the folder loads as the earlier save, or is refused by name; finished, it holds the new save only (no
    stale `model.safetensors`), the folder's other files kept."""
    old, new = two_models(backbone, multi30k_processor, tiny_config, tiny_t5_config)
    model_class, folder = type(old), tmp_path / "model"
    options = {"max_shard_size": "40KB"} if backbone == "marian" else {}

    def save():
        new.save_pretrained(folder, **options)

    old.save_pretrained(folder)
    (folder / "notes.txt").write_text("the user's own file")
    before = model_state(model_class, folder)
    pristine = tmp_path / "pristine"
    shutil.copytree(folder, pristine)
    points = write_points(monkeypatch, save, fault == "kill")
    after = model_state(model_class, folder)
    assert not same_state(after, before) and after[0] != "refused"
    if backbone == "marian":
        assert not (folder / "model.safetensors").exists() and (folder / "model.safetensors.index.json").is_file()
    for fail_at in points:
        shutil.rmtree(folder)
        shutil.copytree(pristine, folder)
        assert save_with_fault(monkeypatch, save, fail_at, fault, folder), fail_at
        check_left(model_state(model_class, folder), before, after, folder, fault)
        assert (folder / "notes.txt").read_text() == "the user's own file"
    shutil.rmtree(folder)
    shutil.copytree(pristine, folder)
    save()
    assert same_state(model_state(model_class, folder), after)
    if fault == "full disk":  # an error removes its staging folder; a kill leaves it for the next process's save
        assert sorted(path.name for path in tmp_path.iterdir()) == ["model", "pristine"]


def processor_state(folder):
    try:
        processor = MgsaProcessor.from_pretrained(folder)
    except (OSError, ValueError) as error:
        return "refused", str(error)
    return len(processor.tokenizer), processor.with_syntax, processor.tokenizer.model_max_length


@pytest.mark.parametrize("fault", ["kill", "full disk"])
def test_processor_save_stopped_at_each_write(multi30k_processor, small_processor, tmp_path, monkeypatch, fault):
    """A processor with syntax (and its conversion file) saved over one without, stopped at each write: the folder
    loads as the earlier processor, or is refused by name."""
    folder = tmp_path / "processor"
    small_processor.save_pretrained(folder)
    before = processor_state(folder)
    pristine = tmp_path / "pristine"
    shutil.copytree(folder, pristine)

    def save():
        multi30k_processor.save_pretrained(folder)

    points = write_points(monkeypatch, save, fault == "kill")
    after = processor_state(folder)
    assert after != before and after[0] != "refused" and (folder / "constituency_conversion.json.gz").is_file()
    for fail_at in points:
        shutil.rmtree(folder)
        shutil.copytree(pristine, folder)
        assert save_with_fault(monkeypatch, save, fail_at, fault, folder), fail_at
        state = processor_state(folder)
        if state[0] == "refused":
            assert str(folder) in state[1]
        else:
            assert state == before or (fault == "kill" and state == after), (fail_at, state)


def test_cli_save_stopped_at_each_write(multi30k_processor, small_processor, tiny_config, tiny_t5_config, tmp_path,
                                        monkeypatch):
    """`mgsa-hf train`'s model folder (model, processor, card) saved over an earlier run's and killed at each write:
    the folder is the earlier run's, whole (model, processor and card), or is refused by name."""
    from mgsa_hf.training.config import load_train_config
    from mgsa_hf.training.model_card import build_model_card
    from mgsa_hf.training.run import _save

    folder = tmp_path / "model"
    config = load_train_config("tiny", [f"output_dir={folder}"])
    old, _ = two_models("marian", small_processor, tiny_config, tiny_t5_config)
    _, new = two_models("marian", multi30k_processor, tiny_config, tiny_t5_config)

    def save_run(model, processor):
        processor = MgsaProcessor(copy.deepcopy(processor.tokenizer), with_syntax=False)
        _save(config, SimpleNamespace(model=model), processor, {"train": range(64)}, {"scores": []}, [],
              build_model_card)

    def state():
        return model_state(MgsaForConditionalGeneration, folder), processor_state(folder), \
            (folder / "README.md").read_text()

    save_run(old, small_processor)
    before = state()
    pristine = tmp_path / "pristine"
    shutil.copytree(folder, pristine)
    points = write_points(monkeypatch, lambda: save_run(new, multi30k_processor))
    after = state()
    assert after[1] != before[1] and not same_state(after[0], before[0])
    for fail_at in points:
        shutil.rmtree(folder)
        shutil.copytree(pristine, folder)
        assert save_with_fault(monkeypatch, lambda: save_run(new, multi30k_processor), fail_at, "kill", folder)
        left = state()
        if left[0][0] == "refused":
            assert str(folder) in left[0][1]
            continue
        whole_before = same_state(left[0], before[0]) and left[1:] == before[1:]
        whole_after = same_state(left[0], after[0]) and left[1:] == after[1:]
        assert whole_before or whole_after, f"write {fail_at}: a mix of two saves"


def test_killed_process_leaves_the_earlier_save(multi30k_processor, tiny_config, tmp_path):
    """A process SIGKILLed while writing a model's weights over an earlier save: the folder loads as the earlier save,
    and the next save removes what the killed one left beside it."""
    import transformers.modeling_utils

    folder = tmp_path / "model"
    old = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1))
    old.save_pretrained(folder)
    new = copy.deepcopy(old)
    for parameter in new.parameters():
        parameter.data.add_(1.0)
    pid = os.fork()  # a process with the modules loaded: a subprocess would spend seconds importing them
    if pid == 0:
        try:
            def killed(tensors, filename, **kwargs):
                with open(filename, "wb") as handle:  # half a file, then the process dies
                    handle.write(b"x" * 1000)
                os.kill(os.getpid(), signal.SIGKILL)

            transformers.modeling_utils.safe_save_file = killed
            new.save_pretrained(folder)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert [path.name for path in tmp_path.iterdir() if path.name != "model"]  # the killed save's folder
    loaded = MgsaForConditionalGeneration.from_pretrained(folder)
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in old.state_dict().items())
    new.save_pretrained(folder)
    assert [path.name for path in tmp_path.iterdir()] == ["model"]


# --- the run's tokenizer ---


# the corpus the tokenizers below are learnt from, as the run's record names it (`tokenizer_record`)
CORPUS_KEY = "multi30k-train-200"


def tokenizer_config(output_dir, vocab_size):
    return SimpleNamespace(tokenizer=None, init_from=None, output_dir=output_dir, vocab_size=vocab_size,
                           source_lang="en", target_lang="de", resume_from_checkpoint=None,
                           tokenizer_max_sentences=None)


@pytest.fixture(scope="module")
def train_split():
    from mgsa_hf.tokenization_utils import read_lines

    pairs = zip(read_lines(MULTI30K / "train.en.gz", 200), read_lines(MULTI30K / "train.de.gz", 200), strict=True)
    return {"translation": [{"en": en, "de": de} for en, de in pairs]}


def test_run_tokenizer_killed_before_its_record(train_split, tmp_path, monkeypatch):
    """A run killed between saving its tokenizer and writing `trained_for.json`: a rerun with a larger `vocab_size`
    trains the vocabulary again (it kept the smaller one without a word)."""
    import json

    from mgsa_hf.training.corpus import load_or_train_tokenizer as _load_or_train_tokenizer
    from mgsa_hf.training.ownership import run_folder

    output_dir = tmp_path / "model"
    real_write_text = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name == "trained_for.json":
            raise Killed()
        return real_write_text(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "write_text", write_text)
        with pytest.raises(Killed):
            _load_or_train_tokenizer(tokenizer_config(output_dir, 120), train_split, corpus_key=CORPUS_KEY)
    tokenizer = _load_or_train_tokenizer(tokenizer_config(output_dir, 250), train_split, corpus_key=CORPUS_KEY)
    assert 120 < len(tokenizer) <= 250
    folder = run_folder(output_dir) / "tokenizer"
    assert json.loads((folder / "trained_for.json").read_text())["vocab_size"] == 250


def test_run_tokenizer_stopped_at_each_write(train_split, tmp_path, monkeypatch):
    """The run's tokenizer trained again (another `vocab_size`) and killed at each write: the next run loads the
    earlier tokenizer when its settings are asked for, or trains the one asked for; never a half-written folder."""
    from mgsa_hf.training.corpus import load_or_train_tokenizer as _load_or_train_tokenizer
    from mgsa_hf.training.ownership import run_folder

    output_dir = tmp_path / "model"
    folder = run_folder(output_dir) / "tokenizer"
    earlier = len(_load_or_train_tokenizer(tokenizer_config(output_dir, 120), train_split, corpus_key=CORPUS_KEY))
    pristine = tmp_path / "pristine"
    shutil.copytree(folder, pristine)

    def save():
        _load_or_train_tokenizer(tokenizer_config(output_dir, 250), train_split, corpus_key=CORPUS_KEY)

    for fail_at in write_points(monkeypatch, save):
        shutil.rmtree(folder)
        shutil.copytree(pristine, folder)
        assert save_with_fault(monkeypatch, save, fail_at, "kill", folder), fail_at
        again = _load_or_train_tokenizer(tokenizer_config(output_dir, 120), train_split, corpus_key=CORPUS_KEY)
        assert len(again) == earlier
    larger = _load_or_train_tokenizer(tokenizer_config(output_dir, 250), train_split, corpus_key=CORPUS_KEY)
    assert 120 < len(larger) <= 250


def test_half_written_run_tokenizer_is_trained_again(train_split, tmp_path, caplog):
    """A tokenizer folder cut short (a run killed while saving it, before saves were swapped in whole) is trained again
    with a warning naming it; it blocked every later run with "You need to have sentencepiece or tiktoken
    installed"."""
    from mgsa_hf.training.corpus import load_or_train_tokenizer as _load_or_train_tokenizer
    from mgsa_hf.training.ownership import run_folder

    output_dir = tmp_path / "model"
    folder = run_folder(output_dir) / "tokenizer"
    _load_or_train_tokenizer(tokenizer_config(output_dir, 120), train_split, corpus_key=CORPUS_KEY)
    (folder / "tokenizer.json").unlink()
    (folder / "trained_for.json").unlink()
    with caplog.at_level("WARNING"):
        tokenizer = _load_or_train_tokenizer(tokenizer_config(output_dir, 120), train_split, corpus_key=CORPUS_KEY)
    assert len(tokenizer) <= 120 and (folder / "tokenizer.json").is_file()
    assert f"the tokenizer in {folder} has no record" in caplog.text


# --- damaged files named on load ---


def test_damaged_generation_config_is_refused(multi30k_processor, tiny_config, tmp_path):
    """A `generation_config.json` cut short was left out without a word (greedy decoding, 20 new tokens): an error
    naming the file."""
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1))
    model.generation_config.num_beams = 4
    model.save_pretrained(tmp_path)
    path = tmp_path / "generation_config.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=rf"{path} is damaged: not valid JSON"):
        MgsaForConditionalGeneration.from_pretrained(tmp_path)
    path.write_text(text)
    assert MgsaForConditionalGeneration.from_pretrained(tmp_path).generation_config.num_beams == 4


def test_garbage_weights_record_is_named(multi30k_processor, tiny_config, tmp_path):
    """A binary `weights.sha256` raised a `UnicodeDecodeError` naming no file."""
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1))
    model.save_pretrained(tmp_path)
    (tmp_path / "weights.sha256").write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match=rf"{tmp_path / 'weights.sha256'} is not a `sha256sum` record"):
        MgsaForConditionalGeneration.from_pretrained(tmp_path)


@pytest.fixture
def trainer(multi30k_processor, tiny_config, tmp_path):
    from transformers import Seq2SeqTrainingArguments

    from mgsa_hf import MgsaDataCollator
    from mgsa_hf.training.trainer import MgsaSeq2SeqTrainer

    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1))
    arguments = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "checkpoints"), report_to=[], use_cpu=True,
                                         max_steps=1, save_strategy="no")
    plain = MgsaProcessor(multi30k_processor.tokenizer, with_syntax=False)
    trainer = MgsaSeq2SeqTrainer(model=model, args=arguments, processing_class=plain.tokenizer,
                                 data_collator=MgsaDataCollator(tokenizer=plain.tokenizer))
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    return trainer


def test_full_disk_at_a_checkpoint_is_named(trainer, tmp_path, monkeypatch):
    """torch.save into a full disk says "[enforce fail at inline_container.cc:672] unexpected pos": the checkpoint
    save raises an `OSError` (`ENOSPC`) naming the cause and the checkpoint folder."""
    real_save = torch.save

    class FullDisk(io.RawIOBase):
        written = 0

        def writable(self):
            return True

        def write(self, data):
            self.written += len(data)
            if self.written > 500:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return len(data)

    monkeypatch.setattr(torch, "save", lambda obj, path, *args, **kwargs: real_save(obj, FullDisk()))
    trainer.state.global_step = 3
    folder = tmp_path / "checkpoints" / "checkpoint-3"
    with pytest.raises(OSError, match=rf"No space left on device: writing the checkpoint {folder} stopped") as raised:
        trainer._save_checkpoint(trainer.model, None)
    assert raised.value.errno == errno.ENOSPC and "unexpected pos" in str(raised.value)


def test_half_optimizer_file_is_named(trainer, tmp_path):
    """A checkpoint's `optimizer.pt` cut short: resuming raised "PytorchStreamReader failed reading zip archive"
    naming no file; the error names the file."""
    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    torch.save(trainer.optimizer.state_dict(), checkpoint / "optimizer.pt")
    torch.save(trainer.lr_scheduler.state_dict(), checkpoint / "scheduler.pt")
    data = (checkpoint / "optimizer.pt").read_bytes()
    (checkpoint / "optimizer.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{checkpoint / 'optimizer.pt'} cannot be read .*cut short or damaged"):
        trainer._load_optimizer_and_scheduler(str(checkpoint))


class Payload:
    """An object a pickle would rebuild by running code: `torch.load(weights_only=True)` refuses it."""

    def __reduce__(self):
        return (print, ("this ran",))


@pytest.mark.parametrize("damage", ["a pickle of code", "cut short"])
def test_a_damaged_random_state_file_is_named(trainer, tmp_path, capsys, damage):
    """A checkpoint's `rng_state.pth` holding a pickle of code, or cut short: torch's unpickling error named no file
    (and the command line showed its traceback); the error names the file, and the pickle's code never runs."""
    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    if damage == "a pickle of code":
        torch.save({"python": Payload()}, checkpoint / "rng_state.pth")
    else:
        torch.save({"cpu": torch.random.get_rng_state()}, checkpoint / "rng_state.pth")
        data = (checkpoint / "rng_state.pth").read_bytes()
        (checkpoint / "rng_state.pth").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{checkpoint / 'rng_state.pth'}: not the random states the Trainer saves"):
        trainer._load_rng_state(str(checkpoint))
    assert "this ran" not in capsys.readouterr().out


# --- a prepared folder's builder and its waiters ---


def _forked_builder(folder: Path, build) -> int:
    """A process (forked: the modules are loaded) that runs `build_once(folder, build)` as the main process; its pid,
    once it has announced itself."""
    import time

    from mgsa_hf.training.builders import building_record
    from mgsa_hf.training.corpus import build_once

    pid = os.fork()
    if pid == 0:
        try:
            build_once(folder, build, True, "the corpus")
        finally:
            os._exit(1)
    deadline = time.monotonic() + 30
    while not building_record(folder).is_file():
        assert time.monotonic() < deadline, "the builder did not start"
        time.sleep(0.05)
    return pid


def _slow_build(staging: Path) -> dict:
    import time

    staging.mkdir(parents=True)
    time.sleep(600)
    return {}


@pytest.mark.parametrize("seen_from", ["this host", "another host"])
def test_a_killed_builder_ends_the_wait_naming_it(tmp_path, monkeypatch, seen_from):
    """The process preparing a corpus is SIGKILLed: a process waiting for it stops with an error naming the builder's
    host and process: at once on its host (the process is gone), and from another host once its beat has stopped for
    `STALE_HEARTBEATS` periods (it waited for ever, "waiting for the main process")."""
    import re
    import socket
    import threading

    from mgsa_hf.training import builders
    from mgsa_hf.training.corpus import wait_for

    monkeypatch.setattr(builders, "HEARTBEAT_SECONDS", 0.2)
    folder = tmp_path / "prepared" / "corpus-0123"
    pid = _forked_builder(folder, _slow_build)
    host = socket.gethostname()
    if seen_from == "another host":
        monkeypatch.setattr(builders.socket, "gethostname", lambda: "another-host")
    errors = []
    waiting = threading.Thread(target=_record_error, args=(errors, wait_for, folder, "the corpus"),
                               kwargs={"poll_seconds": 0.05})
    error, took = _error_once_the_builder_is_killed(waiting, errors, pid, alive_for=1)
    assert re.search(rf"process {pid} on {host} .*ended without finishing it", str(error)), error
    assert took < (1 if seen_from == "this host" else 0.2 * builders.STALE_HEARTBEATS + 2), took


def test_an_earlier_attempts_failure_and_staging_do_not_stop_the_next(tmp_path, monkeypatch, caplog):
    """A `.failed` left by an earlier attempt (a Ctrl-C, in the old one-line form or naming a process that has
    ended) and a record of a killed builder do not end the wait of a process whose builder then succeeds (it read the
    old failure before the main process cleared it); staging folders of ended processes are removed by the next
    build, with a warning, and those of running processes kept. A failure of the current attempt still ends the
    wait with its error."""
    import socket
    import threading
    import time

    from mgsa_hf.training import builders
    from mgsa_hf.training.corpus import build_once, wait_for

    monkeypatch.setattr(builders, "HEARTBEAT_SECONDS", 0.2)
    ended = os.fork()
    if ended == 0:
        os._exit(0)
    os.waitpid(ended, 0)  # a process id that has ended
    host = socket.gethostname()
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    left = {name: prepared / name for name in (f"corpus-a.staging-{host}-{ended}", f"corpus-a.staging-{ended}",
                                               f"corpus-a.staging-{host}-{ended}-text")}
    running = prepared / f"corpus-a.staging-{host}-{os.getppid()}"
    for path in (*left.values(), running):
        path.mkdir()
    earlier_failures = ["KeyboardInterrupt: \n",
                        json.dumps({"error": "KeyboardInterrupt: ", "host": host, "pid": ended, "attempt": "e"})]
    for folder, failure in zip((prepared / "corpus-a", prepared / "corpus-b"), earlier_failures, strict=True):
        folder.with_name(folder.name + ".failed").write_text(failure)
        folder.with_name(folder.name + ".building").write_text(json.dumps({"host": host, "pid": ended,
                                                                           "attempt": "e", "beat": 3}))
        errors = []
        waiting = threading.Thread(target=_record_error, args=(errors, wait_for, folder, "the corpus"),
                                   kwargs={"poll_seconds": 0.05})
        with caplog.at_level("WARNING"):
            waiting.start()
            time.sleep(1)
            assert waiting.is_alive(), errors
            build_once(folder, lambda staging: staging.mkdir() or {"rows": 1}, True, "the corpus")
            waiting.join(timeout=10)
        assert not waiting.is_alive() and errors == []
        assert (folder / "prepared.json").is_file() and not folder.with_name(folder.name + ".failed").exists()
    assert "holds the error of an earlier attempt" in caplog.text
    assert not any(path.exists() for path in left.values()) and running.is_dir()
    assert all(str(path) in caplog.text for path in left.values())

    failing = prepared / "corpus-c"
    errors = []
    waiting = threading.Thread(target=_record_error, args=(errors, wait_for, failing, "the corpus"),
                               kwargs={"poll_seconds": 0.05})
    waiting.start()
    time.sleep(0.3)

    def broken(staging):
        raise ValueError("no file for split train")

    with pytest.raises(ValueError):
        build_once(failing, broken, True, "the corpus")
    waiting.join(timeout=10)
    assert [type(error) for error in errors] == [RuntimeError]
    assert "failed to prepare the corpus" in str(errors[0]) and "no file for split train" in str(errors[0])


def _record_error(errors: list, function, *args, **kwargs) -> None:
    try:
        function(*args, **kwargs)
    except Exception as error:
        errors.append(error)


def _error_once_the_builder_is_killed(waiting, errors: list, pid: int, alive_for: float) -> tuple[Exception, float]:
    """Start the thread `waiting` (which appends the error its wait ends with to `errors`), check that it still waits
    after `alive_for` seconds (the builder's beat goes on), then SIGKILL the builder `pid`: the one `RuntimeError`
    the wait ended with, and the seconds it took after the kill."""
    import time

    try:
        waiting.start()
        time.sleep(alive_for)
        assert waiting.is_alive() and errors == []
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    killed = time.monotonic()
    waiting.join(timeout=30)
    took = time.monotonic() - killed
    assert not waiting.is_alive() and [type(error) for error in errors] == [RuntimeError]
    return errors[0], took


def test_an_earlier_tokenizer_failure_does_not_stop_the_next_launch(train_split, tmp_path, caplog):
    """`tokenizer.failed` left by a run stopped with Ctrl-C: a process that waits for the run's tokenizer (it read the
    marker before the main process cleared it) loads the tokenizer the main process then trains."""
    import threading
    import time

    from mgsa_hf.training.corpus import load_or_train_tokenizer as _load_or_train_tokenizer
    from mgsa_hf.training.ownership import run_folder

    output_dir = tmp_path / "model"
    run_folder(output_dir).mkdir(parents=True)
    (run_folder(output_dir) / "tokenizer.failed").write_text("KeyboardInterrupt: \n")
    loaded, errors = [], []

    def other_process():
        try:
            loaded.append(_load_or_train_tokenizer(tokenizer_config(output_dir, 120), train_split, is_main=False,
                                                   corpus_key=CORPUS_KEY))
        except Exception as error:
            errors.append(error)

    waiting = threading.Thread(target=other_process)
    with caplog.at_level("WARNING"):
        waiting.start()
        time.sleep(1)
        assert waiting.is_alive(), errors
        main = _load_or_train_tokenizer(tokenizer_config(output_dir, 120), train_split, corpus_key=CORPUS_KEY)
        waiting.join(timeout=30)
    assert errors == [] and len(loaded) == 1 and loaded[0].get_vocab() == main.get_vocab()
    assert "holds the error of an earlier attempt" in caplog.text


def test_a_save_keeps_the_folders_other_subfolders(tmp_path):
    """A save into a folder that holds a subfolder of the user's (with a file and a symbolic link in it) keeps it
    whole beside what the save wrote (it stopped with "'str' object has no attribute 'is_symlink'")."""
    from mgsa_hf.atomic_saves import staged_folder

    folder = tmp_path / "model"
    (folder / "notes" / "deep").mkdir(parents=True)
    (folder / "notes" / "deep" / "log.txt").write_text("kept")
    (folder / "notes" / "latest").symlink_to("deep/log.txt")
    (folder / "config.json").write_text("{}")
    with staged_folder(folder) as staging:
        (staging / "config.json").write_text('{"saved": true}')
    assert (folder / "config.json").read_text() == '{"saved": true}'
    assert (folder / "notes" / "latest").is_symlink() and (folder / "notes" / "latest").read_text() == "kept"
