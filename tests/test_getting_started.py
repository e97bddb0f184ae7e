"""A new user's first commands from any folder: the recipes, `mgsa-hf evaluate` and the benchmark scripts find
Multi30k through `MGSA_HF_DATA`, and without it the error says what to do; the `threads` setting reaches torch."""

import os
from pathlib import Path

import pytest
import torch
from conftest import DATA_ROOT, MULTI30K_DIR

from mgsa_hf.cli import build_parser, main
from mgsa_hf.training.catalogue import SHARED_MULTI30K, default_data
from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.corpus import corpus_parts
from mgsa_hf.training.run import train


REPO = Path(__file__).resolve().parents[1]
SPLIT_FILES = {f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("en", "de")}


@pytest.mark.parametrize("recipe", [None, "tiny", "tiny_t5", "multi30k_gpu"])
def test_recipes_read_multi30k_from_MGSA_HF_DATA_in_any_folder(recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository: ../shared/data is not there
    monkeypatch.setenv("MGSA_HF_DATA", str(DATA_ROOT))
    config = load_train_config(recipe)
    assert config.data == str(MULTI30K_DIR)
    files = {part["file"] for part in corpus_parts(config)["data"] if "sha256" in part}  # the files, read from disk
    assert SPLIT_FILES <= files
    args = build_parser().parse_args(["evaluate", "runs/model"])
    assert args.data == str(MULTI30K_DIR) and args.split == "test_2016_flickr"
    assert default_data(tmp_path / "checkout") == str(MULTI30K_DIR)  # the benchmark scripts' default


def test_without_the_data_the_first_commands_say_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MGSA_HF_DATA", raising=False)
    config = load_train_config(None, [f"output_dir={tmp_path / 'run'}"])
    assert config.data == SHARED_MULTI30K == "../shared/data/multi30k"
    assert default_data(tmp_path / "checkout") == str(tmp_path / "shared" / "data" / "multi30k")
    tried = os.path.abspath(SHARED_MULTI30K)
    with pytest.raises(FileNotFoundError) as error:
        train(config)
    message = str(error.value)
    for part in (f"tried {tried}", "data=FOLDER", "MGSA_HF_DATA is not set", "set MGSA_HF_DATA",
                 "docs/getting-started.md#the-data"):
        assert part in message
    assert not (tmp_path / "run").exists() and not (tmp_path / "run-run").exists()  # stopped before any work
    # the page and section it names exist
    assert "\n## The data\n" in (REPO / "docs" / "getting-started.md").read_text()

    (tmp_path / "model").mkdir()
    monkeypatch.setenv("MGSA_HF_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit) as stop:
        main(["evaluate", str(tmp_path / "model")])
    message = str(stop.value)
    assert f"tried {tmp_path / 'nowhere' / 'multi30k'}" in message and "--data FOLDER" in message
    assert f"MGSA_HF_DATA='{tmp_path / 'nowhere'}' is set" in message and "getting-started.md#the-data" in message


def test_threads_reaches_torch_before_training(tmp_path):
    """`threads=N` sets torch's threads in the training process: the Trainer's steps run on N threads."""
    from transformers import TrainerCallback

    before = torch.get_num_threads()
    wanted = 2 if before == 1 else 1
    seen = []

    class Threads(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(torch.get_num_threads())

    config = load_train_config("tiny", [f"data={MULTI30K_DIR}", f"output_dir={tmp_path / 'run'}", f"threads={wanted}",
                                        "training.max_steps=1", "training.eval_strategy=no", "max_test_samples=2",
                                        "max_eval_samples=2", "collapse_check_step=null"])
    assert config.threads == wanted
    try:
        train(config, callbacks=[Threads()])
        assert seen == [wanted]
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="`threads` must be a whole number >= 1"):
        train(load_train_config("tiny", [f"data={MULTI30K_DIR}", f"output_dir={tmp_path / 'bad'}", "threads=0"]))
