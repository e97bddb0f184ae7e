"""The trust boundary: nothing read from a saved folder names code that the package imports or calls, unless the user
passes `trust_remote_code=True` (as Transformers asks for a folder's own code). A folder's `tree_parser` import path
and `parser_code` are refused at every entry point that reads them (the processor, `AutoProcessor`, the translation
pipeline, fine-tuning with `mgsa-hf train init_from=...`, the converter), and a run's saved state is read as data
only. The hostile settings name a probe module whose import leaves a marker file, so each test sees whether any of
its code ran."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoProcessor, pipeline

from mgsa_hf import MgsaForConditionalGeneration, MgsaProcessor
from mgsa_hf.syntax_spacy import UntrustedCodeError
from mgsa_hf.training.config import _check_run_settings, load_train_config
from mgsa_hf.training.conversion import convert_checkpoint
from mgsa_hf.training.prepared import load_run_state


pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
PROBE = "mgsa_trust_probe"
SENTENCES = ["A man rides a bike.", "Two dogs play in the snow."]


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """The marker file that the probe module writes when it is imported (its `parse`, a tree parser, returns None:
    the derived tree). The module is importable for this test only."""
    folder, marker = tmp_path / "probe", tmp_path / "probe-ran"
    folder.mkdir()
    (folder / f"{PROBE}.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).touch()\n\n\n"
                                        "def parse(text):\n    return None\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, PROBE, raising=False)
    return marker


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, multi30k_processor, tiny_config):
    """A tiny RHE model (it reads dependency heads and local phrases) saved with its processor."""
    folder = tmp_path_factory.mktemp("rhe")
    torch.manual_seed(0)
    MgsaForConditionalGeneration(tiny_config(multi30k_processor, "rhe")).save_pretrained(folder)
    multi30k_processor.save_pretrained(folder)
    return folder


def hostile_copy(model_folder, target: Path, **settings) -> Path:
    """A copy of `model_folder` whose `processor_config.json` says `settings`."""
    import shutil

    shutil.copytree(model_folder, target)
    path = target / "processor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))
    return target


HOSTILE = [
    pytest.param({"tree_parser": f"{PROBE}:parse"}, id="tree_parser"),
    pytest.param({"parser_code": PROBE}, id="parser_code"),
]


@pytest.mark.parametrize("settings", HOSTILE)
def test_a_folders_code_is_refused_by_every_loader(model_folder, tmp_path, probe, settings):
    """`MgsaProcessor.from_pretrained`, `AutoProcessor.from_pretrained` and `pipeline("translation")` refuse the
    folder, naming the setting and `trust_remote_code`, and import nothing; with `trust_remote_code=True` the
    processor is the folder's (so the probe runs)."""
    folder = hostile_copy(model_folder, tmp_path / "hostile", **settings)
    (key, value), = settings.items()
    for load in (lambda: MgsaProcessor.from_pretrained(folder), lambda: AutoProcessor.from_pretrained(folder),
                 lambda: pipeline("translation", model=str(folder), device="cpu")):
        with pytest.raises(UntrustedCodeError, match=rf"{key}='{value}'.*trust_remote_code=True"):
            load()
    assert not probe.exists()
    for trusted in (MgsaProcessor.from_pretrained(folder, trust_remote_code=True),
                    AutoProcessor.from_pretrained(folder, trust_remote_code=True)):
        assert getattr(trusted, key) == value
    trusted(SENTENCES)
    assert probe.exists()


def test_os_system_in_a_folder_never_runs(model_folder, tmp_path):
    """The reported case: `"tree_parser": "os:system"` would run every source sentence as a shell command."""
    folder = hostile_copy(model_folder, tmp_path / "hostile", tree_parser="os:system")
    marker = tmp_path / "created-by-a-sentence"
    with pytest.raises(UntrustedCodeError, match="os:system"):
        MgsaProcessor.from_pretrained(folder)(f"touch {marker}")
    with pytest.raises(UntrustedCodeError, match="os:system"):
        pipeline("translation", model=str(folder), device="cpu")(f"touch {marker}")
    assert not marker.exists()


def test_the_callers_own_settings_replace_the_folders(model_folder, tmp_path, probe, multi30k_processor):
    """A tree parser given in the call is the user's own choice: it replaces the saved one, which is then never
    imported; the processor makes what a fresh one makes."""
    folder = hostile_copy(model_folder, tmp_path / "hostile", tree_parser=f"{PROBE}:parse", parser_code=PROBE)
    processor = MgsaProcessor.from_pretrained(folder, tree_parser=None, parser_code=None)
    assert processor.tree_parser is None and processor.parser_code is None
    assert dict(processor(SENTENCES)) == dict(multi30k_processor(SENTENCES))
    assert not probe.exists()


def test_fine_tuning_from_a_folder_that_names_code(model_folder, tmp_path, probe):
    """`mgsa-hf train init_from=FOLDER` takes the folder's processor settings: those that name code are refused before
    any work (nothing written) unless `trust_remote_code=true` or the recipe's `processor` section replaces them."""
    folder = hostile_copy(model_folder, tmp_path / "hostile", tree_parser=f"{PROBE}:parse")
    output_dir = tmp_path / "run"
    refused = subprocess.run(
        [sys.executable, "-m", "mgsa_hf.cli", "train", f"init_from={folder}", f"output_dir={output_dir}"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(probe.parent / "probe"), *sys.path])},
    )
    assert refused.returncode != 0
    assert "trust_remote_code=true" in refused.stderr and "Traceback" not in refused.stderr
    assert not output_dir.exists() and not Path(f"{output_dir}-run").exists() and not probe.exists()
    for overrides in (["trust_remote_code=true"], ["processor.tree_parser=null"]):
        _check_run_settings(load_train_config(None, [f"init_from={folder}", *overrides]))
    with pytest.raises(ValueError, match="trust_remote_code"):
        _check_run_settings(load_train_config(None, [f"init_from={folder}", "trust_remote_code=yes"]))
    assert not probe.exists()


def test_the_converter_keeps_a_folders_code_only_when_trusted(model_folder, tmp_path, probe):
    """`convert_checkpoint` (and `mgsa-hf convert`) carries the source processor's settings into the new
    folder: one that names code is refused before anything is written, unless `trust_remote_code`."""
    folder = hostile_copy(model_folder, tmp_path / "hostile", parser_code=PROBE)
    advice = "pass `trust_remote_code=True`, or `--trust-remote-code`;"
    with pytest.raises(UntrustedCodeError, match=f"parser_code='mgsa_trust_probe'.*{advice}"):
        convert_checkpoint(str(folder), str(tmp_path / "refused"))
    assert not (tmp_path / "refused").exists()
    convert_checkpoint(str(folder), str(tmp_path / "trusted"), trust_remote_code=True)
    assert json.loads((tmp_path / "trusted" / "processor_config.json").read_text())["parser_code"] == PROBE
    assert not probe.exists()  # converting saves the setting; it imports nothing


class _RunsOnLoad:
    """A pickled object whose unpickling would create `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_run_state_is_read_as_data(tmp_path):
    """A prepared run's `state.pt` is loaded with `weights_only=True`: a crafted pickle is refused by name, and runs
    nothing; a real state loads."""
    marker, path = tmp_path / "ran", tmp_path / "state.pt"
    torch.save({"step": 3, "payload": _RunsOnLoad(marker)}, path)
    with pytest.raises(ValueError, match=rf"{path}.*not a training state"):
        load_run_state(path)
    assert not marker.exists()
    torch.save({"step": 3, "rng": torch.get_rng_state(), "model": {"w": torch.ones(2)}}, path)
    assert load_run_state(path)["step"] == 3


def test_every_torch_load_reads_data_only():
    """Every `torch.load` of the package and its scripts says `weights_only=True`."""
    calls = []
    for path in [*REPO.glob("src/mgsa_hf/*.py"), *REPO.glob("scripts/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load" and \
                    getattr(node.func.value, "id", None) == "torch":
                safe = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in node.keywords)
                calls.append((f"{path.name}:{node.lineno}", safe))
    assert calls and all(safe for _, safe in calls), [where for where, safe in calls if not safe]
