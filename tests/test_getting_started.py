"""A new user's first hour: the recipes, `mgsa-hf evaluate` and the benchmark scripts find Multi30k through
`MGSA_HF_DATA` from any folder, and without it the error says what to do; the `threads` setting reaches torch; the
API reference's `Seq2SeqTrainer` example runs as written."""

import ast
import dataclasses
import inspect
import os
import re
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


@pytest.mark.usefixtures("one_thread")
def test_the_seq2seq_trainer_example_of_the_api_reference_runs(tmp_path, monkeypatch, capsys):
    """The Python example of docs/reference/training.md, run as it stands: `Seq2SeqTrainer` trains 40 steps and the
    saved folder translates as the trained model does."""
    from transformers import pipeline

    page = (REPO / "docs" / "reference" / "training.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MGSA_HF_DATA", str(DATA_ROOT))
    namespace = {}
    exec(compile(example, "docs/reference/training.md", "exec"), namespace)
    assert namespace["trainer"].state.global_step == 40
    printed = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])
    translator = pipeline("translation", model=str(tmp_path / "runs" / "example" / "model"), device="cpu")
    (row,) = translator(["A dog runs in the snow."], num_beams=4, max_new_tokens=20)
    assert len(printed) == 1 and row["translation_text"] == " ".join(printed[0].split())  # the pipeline's spacing


def test_the_configuration_reference_documents_every_encoder_field():
    """docs/reference/configuration.md renders `MgsaVariantConfig`'s docstring (assembled from the variants' modules,
    so read by inspection): one parameter entry for each of its fields, the shared and every variant's."""
    griffe = pytest.importorskip("griffe")
    from mgsa_hf.configuration_mgsa import MgsaVariantConfig

    page = (REPO / "docs" / "reference" / "configuration.md").read_text()
    assert re.search(r"::: mgsa_hf\.configuration_mgsa\.MgsaVariantConfig\n    options:\n      force_inspection: true",
                     page)
    sections = griffe.Docstring(inspect.cleandoc(MgsaVariantConfig.__doc__), parser="google").parse()
    documented = [parameter.name for section in sections if section.kind is griffe.DocstringSectionKind.parameters
                  for parameter in section.value]
    fields = [field.name for field in dataclasses.fields(MgsaVariantConfig)]
    assert len(fields) > 30 and {"pr_glance", "rhe_layers", "hybrid_window", "phrase_partition"} <= set(fields)
    assert sorted(documented) == sorted(fields)
