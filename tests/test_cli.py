"""The `mgsa-hf` command line: user errors are one line without a traceback (`--debug` shows it), every command's
`--help` lists its options (`train`'s: the config keys, recipes and rows), the packaged recipes, rows and
`accelerate launch` configs resolve by name, and `translate`, `evaluate`, `finetune` and `export` run on a tiny
trained folder."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import MULTI30K_DIR
from huggingface_hub import ModelCard
from transformers import pipeline

from mgsa_hf import MgsaConfig
from mgsa_hf.cli import main
from mgsa_hf.evaluation import translation_scores
from mgsa_hf.tokenization_utils import read_lines
from mgsa_hf.training.catalogue import ACCELERATE_CONFIGS, accelerate_config_names, recipe_names, row_names
from mgsa_hf.training.config import TrainConfig, load_train_config
from mgsa_hf.training.ownership import run_folder
from mgsa_hf.training.run import train


REPO = Path(__file__).resolve().parents[1]
DATA = MULTI30K_DIR
SOURCES = ["A man rides a bike.", "Two dogs play in the snow.", "A girl sings."]


def run_cli(*arguments, cwd):
    return subprocess.run([sys.executable, "-m", "mgsa_hf.cli", *map(str, arguments)], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_a_user_error_is_one_line(tmp_path):
    """A missing corpus, from a folder outside the repository as a user runs it: exit status 1, one line naming the
    command and the folder, nothing written; with `--debug`, the traceback."""
    result = run_cli("train", f"data={tmp_path}/no-corpus", f"output_dir={tmp_path}/run", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"mgsa-hf train: error: corpus '{tmp_path}/no-corpus' does not exist")
    assert "data=FOLDER" in line and "MGSA_HF_DATA" in line and "docs/getting-started.md#the-data" in line
    assert not (tmp_path / "run").exists()
    with pytest.raises(FileNotFoundError, match="no-such-recipe"):  # the error itself: Python prints its traceback
        main(["train", "--debug", "recipe=no-such-recipe"])


@pytest.mark.parametrize(("arguments", "message"), [
    (["train", "recipe=no-such-recipe"], "'no-such-recipe' is neither a file nor a packaged recipe \\(default"),
    (["translate", "{tmp}/no-model"], "model folder '.*no-model' does not exist."),
    (["train", "recipe=tiny", "bogus_key=1"], r"unknown training config key\(s\) \['bogus_key'\]"),
    (["train", "tiny", "recipe=default"], "name one recipe"),
    (["train", "recipe=tiny", "model=rhe/no_such_row"], "'rhe/no_such_row' is neither an encoder type"),
    (["train", "recipe=tiny", "model.encoder_type=bogus", "data={data}", "output_dir={tmp}/run"],
     "encoder_type.*got bogus"),
    (["finetune", "tiny"], "takes key=value overrides only"),
    (["evaluate", "{tmp}", "--data", "{tmp}/no-corpus"], "corpus '.*no-corpus' does not exist .*--data FOLDER"),
    (["convert", "{tmp}/no-marian", "{tmp}/out"], "marian='.*no-marian': no such folder"),
    (["export", "ct2", "{tmp}/no-model", "{tmp}/out"], "model folder '.*no-model' does not exist"),
    (["accelerate-config", "no_such"], "no packaged accelerate config 'no_such' \\(the configs: cpu_2proc, deepspeed"),
    (["accelerate-config", "../recipes/tiny"], "no packaged accelerate config '../recipes/tiny'"),
    (["accelerate-config", "no_such", "--write", "{tmp}/run"], "no packaged accelerate config 'no_such'"),
])
def test_user_errors_in_process(tmp_path, arguments, message):
    with pytest.raises(SystemExit, match=rf"^mgsa-hf {arguments[0]}: error: .*{message}") as exit_info:
        main([argument.format(tmp=tmp_path, data=DATA) for argument in arguments])
    assert "\n" not in str(exit_info.value.code)
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


def test_export_onnx_without_the_generation_module_is_one_line(tmp_path, monkeypatch):
    """`mgsa_hf.export.onnx_generation` (or onnxruntime) missing: the error says what to install. Present, the
    commands find it (the error must not stand for a wrong module path)."""
    from mgsa_hf.cli.commands import _onnx_generation

    pytest.importorskip("onnxruntime")
    assert _onnx_generation("exporting").__name__ == "mgsa_hf.export.onnx_generation"
    monkeypatch.setitem(sys.modules, "mgsa_hf.export.onnx_generation", None)
    with pytest.raises(SystemExit, match=r"^mgsa-hf export: error: .*needs the ONNX generation export.*\[export\]"):
        main(["export", "onnx", str(tmp_path), str(tmp_path / "out")])
    (tmp_path / "encoder_model.onnx").write_bytes(b"")
    with pytest.raises(SystemExit, match=r"^mgsa-hf translate: error: translating an ONNX folder needs"):
        main(["translate", str(tmp_path), "--input", str(tmp_path / "encoder_model.onnx")])


def help_text(capsys, *command) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_train_help_lists_keys_recipes_and_rows(capsys):
    text = help_text(capsys, "train")
    assert "vocab_size = 8000" in text and "init_new_modules = 'identity'" in text and "--debug" in text
    assert all(f"  {item} = " in text for item in TrainConfig.__dataclass_fields__)
    assert all(f"  {name} " in text for name in recipe_names()) and "recipe=finetune" in text
    assert all(name in text.split() for name in row_names()) and "rhe/dea_rhe" in text


@pytest.mark.parametrize(("command", "options"), [
    (["translate"], ["--input", "--output", "--batch-size", "--num-beams", "--max-new-tokens", "--truncation",
                     "--threads", "--trust-remote-code"]),
    (["evaluate"], ["--data", "--split", "--max-samples", "--num-beams", "--output", "--threads",
                    "--trust-remote-code"]),
    (["convert"], ["--encoder-type", "--new-modules-init", "--set", "--trust-remote-code", "--overwrite"]),
    (["export", "onnx"], ["--int8", "--debug", "--overwrite", "--trust-remote-code"]),
    (["export", "ct2"], ["--quantization", "--overwrite"]),
    (["demo"], ["--encoder-types"]),
    (["prepare"], ["--num-proc", "KEY=VALUE"]),
    (["finetune"], ["KEY=VALUE", "recipe=finetune"]),
    (["accelerate-config"], ["NAME", "--write", "multi_gpu_ddp", "cpu_2proc", "--debug"]),
])
def test_every_command_help_lists_its_options(capsys, command, options):
    text = help_text(capsys, *command)
    assert all(option in text for option in options), text


def test_recipes_and_rows_resolve_by_name(tmp_path):
    """Every packaged recipe loads by name; every row sets valid model fields over a recipe's sizes; `init_from`
    without a recipe fine-tunes with the fine-tuning recipe, not the from-scratch one."""
    assert {"default", "finetune", "tiny", "tiny_t5", "multi30k_gpu", "wmt14"} <= set(recipe_names())
    for name in recipe_names():
        assert load_train_config(None, [f"recipe={name}"]) == load_train_config(name, [])
    assert len(row_names()) >= 40
    for name in row_names():
        model = load_train_config(None, ["recipe=multi30k_gpu", f"model={name}"]).model  # 6 layers, as the papers
        fields = json.loads((REPO / "src" / "mgsa_hf" / "rows" / f"{name}.json").read_text())
        assert model == {**load_train_config("multi30k_gpu").model, **fields}
        MgsaConfig(**model)  # the row's fields are valid together
    later = load_train_config(None, ["recipe=tiny", "model=rhe/dea_rhe", "model.rhe_layers=[1]"]).model
    assert later["rhe_attention"] == "dea" and later["rhe_layers"] == [1]
    scratch, finetune = load_train_config(None, []), load_train_config(None, ["init_from=some/folder"])
    assert finetune == load_train_config("finetune", ["init_from=some/folder"])
    assert finetune.training["learning_rate"] == 0.001 != scratch.training["learning_rate"]
    assert finetune.training["warmup_steps"] == 30 and finetune.model == {}
    row_file = tmp_path / "mine.json"
    row_file.write_text('{"encoder_type": "hybrid", "hybrid_window": 5}')
    assert load_train_config("tiny", [f"model={row_file}"]).model["hybrid_window"] == 5


ACCELERATE_CONFIG_NAMES = {"single_gpu", "multi_gpu_ddp", "fsdp", "deepspeed_zero2", "cpu_2proc"}


def test_accelerate_configs_resolve_by_name(capsys):
    """`mgsa-hf accelerate-config NAME` prints the path of the packaged config of that name, for every name; with no
    name it lists each name with its comment's first line; every name the docs launch with is one of them."""
    assert set(accelerate_config_names()) == ACCELERATE_CONFIG_NAMES
    for name in ACCELERATE_CONFIG_NAMES:
        main(["accelerate-config", name])
        path = Path(capsys.readouterr().out.strip())
        assert path.is_absolute() and path.is_file() and path == ACCELERATE_CONFIGS / f"{name}.yaml"
        assert yaml.safe_load(path.read_text())["compute_environment"] == "LOCAL_MACHINE"
    main(["accelerate-config"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == sorted(ACCELERATE_CONFIG_NAMES)
    assert any(line.startswith("cpu_2proc ") and "gloo" in line for line in lines)
    assert all(len(line.split()) > 2 for line in lines)  # a name and what it is for
    documents = [REPO / "README.md", *(REPO / "docs").glob("*.md"), ACCELERATE_CONFIGS / "README.md",
                 *(REPO / "src" / "mgsa_hf" / "training" / "recipes").glob("*.yaml"),
                 *ACCELERATE_CONFIGS.glob("*.yaml")]
    named = {name for path in documents for name in re.findall(r"accelerate-config ([a-z]\w*)", path.read_text())}
    assert "multi_gpu_ddp" in named and named <= ACCELERATE_CONFIG_NAMES


def test_accelerate_config_write_copies_without_overwriting(tmp_path, capsys):
    """`--write DIR` copies every config and the README (or the named config alone) and refuses to overwrite."""
    main(["accelerate-config", "--write", str(tmp_path / "all")])
    written = capsys.readouterr().out.split()
    expected = sorted([*(f"{name}.yaml" for name in ACCELERATE_CONFIG_NAMES), "README.md"])
    assert sorted(Path(path).name for path in written) == expected
    for name in expected:
        assert (tmp_path / "all" / name).read_bytes() == (ACCELERATE_CONFIGS / name).read_bytes()
    main(["accelerate-config", "fsdp", "--write", str(tmp_path / "one")])
    assert [path.name for path in (tmp_path / "one").iterdir()] == ["fsdp.yaml"]
    (tmp_path / "all" / "fsdp.yaml").write_text("edited")
    with pytest.raises(SystemExit, match=r"^mgsa-hf accelerate-config: error: .*all already holds .*fsdp.yaml"):
        main(["accelerate-config", "--write", str(tmp_path / "all")])
    assert (tmp_path / "all" / "fsdp.yaml").read_text() == "edited"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli") / "tiny"
    train(load_train_config("tiny", [f"data={DATA}", f"output_dir={folder}", "training.max_steps=2"]))
    return folder


def test_translate_and_evaluate_a_trained_folder(tiny_folder, tmp_path, capsys):
    """`translate` writes what the pipeline translates, on the threads `--threads` sets; `evaluate` scores the
    pipeline's translations of a split with sacreBLEU and reads the card's BLEU of that split."""
    (tmp_path / "src.en").write_text("\n".join(SOURCES) + "\n")
    threads = torch.get_num_threads()
    try:
        main(["translate", str(tiny_folder), "--input", str(tmp_path / "src.en"), "--output", str(tmp_path / "hyp.de"),
              "--num-beams", "2", "--batch-size", "2", "--threads", str(2 if threads == 1 else 1)])
        assert torch.get_num_threads() == (2 if threads == 1 else 1)
    finally:
        torch.set_num_threads(threads)
    translator = pipeline("translation", model=str(tiny_folder), device="cpu")
    expected = [row["translation_text"] for row in translator(SOURCES, num_beams=2)]
    assert (tmp_path / "hyp.de").read_text().splitlines() == expected

    capsys.readouterr()
    main(["evaluate", str(tiny_folder), "--data", str(DATA), "--split", "val", "--max-samples", "8",
          "--output", str(tmp_path / "report.json")])
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((tmp_path / "report.json").read_text())
    references = list(read_lines(DATA / "val.de.gz"))[:8]
    translations = [row["translation_text"]
                    for row in translator(list(read_lines(DATA / "val.en.gz"))[:8], truncation=True)]
    scores = translation_scores(translations, references)
    assert report["sentences"] == 8 and report["bleu"] == pytest.approx(scores["bleu"])
    assert report["bleu_signature"] == scores["bleu_signature"] and "nrefs:1" in report["bleu_signature"]
    card = ModelCard.load(tiny_folder / "README.md")  # the card names Multi30k's val by the Hub's name
    assert report["card_bleu"] == next(result.metric_value for result in card.data.eval_results
                                       if result.metric_type == "bleu" and result.dataset_split == "validation")


def test_finetune_command_keeps_the_checkpoint(tiny_folder, tmp_path):
    """`mgsa-hf finetune init_from=FOLDER model.encoder_type=rhe`: the fine-tuning recipe, the checkpoint's width."""
    output = tmp_path / "rhe"
    main(["finetune", f"init_from={tiny_folder}", "model.encoder_type=rhe", f"data={DATA}", f"output_dir={output}",
          "max_train_samples=32", "max_eval_samples=4", "max_test_samples=4", "training.max_steps=1",
          "training.per_device_eval_batch_size=4", "training.generation_num_beams=1",
          "training.generation_max_length=8", "reuse_cpu_memory=false", "examples=[]"])
    config = json.loads((output / "config.json").read_text())
    assert config["encoder_type"] == "rhe" and config["d_model"] == 32
    assert json.loads((run_folder(output) / "results.json").read_text())["global_step"] == 1
