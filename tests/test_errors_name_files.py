"""Errors that name the file: a damaged file of a saved folder, a recipe, an input or output file of a command, a
tree model file. Each gives an error naming the file (and the line, or the field), raised from the reader's own error;
before, each was a library's message naming none, or the processor was reported missing."""

import argparse
import errno
import gzip
import json
import os
import random
import shutil

import pytest
import torch
from conftest import MULTI30K_DIR, tiny_sizes
from transformers import MarianConfig, MarianMTModel, T5Config, pipeline

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration, MgsaProcessor
from mgsa_hf.cli import main
from mgsa_hf.constituency_conversion import DependencyToConstituency
from mgsa_hf.saved_files import DamagedFileError
from mgsa_hf.tokenization_utils import train_joint_tokenizer
from mgsa_hf.training.config import load_train_config


pytestmark = pytest.mark.usefixtures("one_thread")

PAIRS = [
    ("A man rides a bike down the street.", "Ein Mann fährt mit dem Fahrrad die Straße entlang."),
    ("Two dogs are playing in the snow.", "Zwei Hunde spielen im Schnee."),
    ("A woman in a red dress is singing.", "Eine Frau in einem roten Kleid singt."),
    ("Children play soccer in a park.", "Kinder spielen Fußball in einem Park."),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Saved folders of a tiny RHE model (reads syntax) and a tiny transformer (its tokenizer alone serves it), each
    with its processor, and the tokenizer: `{"rhe": folder, "transformer": folder, "tokenizer": tokenizer}`."""
    root = tmp_path_factory.mktemp("saved")
    for lang, column in (("en", 0), ("de", 1)):
        (root / f"text.{lang}").write_text("\n".join(pair[column] for pair in PAIRS) + "\n", encoding="utf-8")
    tokenizer = train_joint_tokenizer(root / "text.en", root / "text.de", root / "tokenizer", vocab_size=120)
    processor = MgsaProcessor(tokenizer)
    folders = {"tokenizer": tokenizer}
    for encoder_type in ("rhe", "transformer"):
        torch.manual_seed(0)
        config = MgsaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            decoder_start_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                            encoder_type=encoder_type, num_phrase_tags=len(processor.phrase_tags),
                            **tiny_sizes(encoder_layers=1))
        model = MgsaForConditionalGeneration(config)
        model.generation_config.num_beams, model.generation_config.max_new_tokens = 1, 3
        folders[encoder_type] = root / encoder_type
        model.save_pretrained(folders[encoder_type])
        processor.save_pretrained(folders[encoder_type])
    return folders


def copy_of(saved, encoder_type, tmp_path):
    folder = tmp_path / encoder_type
    shutil.copytree(saved[encoder_type], folder)
    return folder


def cut_short(path):
    """The file's first half: JSON cut off in the middle (a copy or a save that stopped)."""
    text = path.read_text(encoding="utf-8")
    path.write_text(text[: len(text) // 2], encoding="utf-8")


def binary(path):
    """Bytes that are not UTF-8 at line 2 (the file overwritten by something else)."""
    path.write_bytes(b'{"a": 1,\n"b": "\xff\xfe"}')


@pytest.mark.parametrize("name", ["tokenizer.json", "processor_config.json", "tokenizer_config.json"])
@pytest.mark.parametrize(("damage", "match", "cause"), [
    (cut_short, r", line \d+, column \d+: not valid JSON", json.JSONDecodeError),
    (binary, r", line 2: not UTF-8 text \(byte 0xff", UnicodeDecodeError),
])
def test_damaged_processor_file_is_named(saved, tmp_path, name, damage, match, cause):
    """`MgsaProcessor.from_pretrained` failed with a bare `JSONDecodeError` / `UnicodeDecodeError`, and the pipeline
    said that the processor was missing (RHE), or went on with the tokenizer alone (the transformer, a damaged
    `processor_config.json`): each now names the file and the line, raised from the decoder's error."""
    for encoder_type in ("rhe", "transformer"):
        folder = copy_of(saved, encoder_type, tmp_path)
        damage(folder / name)
        expected = rf"{folder / name} is damaged{match}"
        with pytest.raises(DamagedFileError, match=expected) as error_info:
            MgsaProcessor.from_pretrained(folder)
        assert isinstance(error_info.value.__cause__, cause)
        with pytest.raises(DamagedFileError, match=expected) as error_info:
            pipeline("translation", model=str(folder))
        assert isinstance(error_info.value.__cause__, cause)


def test_damaged_model_config_of_a_folder_without_processor_config(saved, tmp_path):
    """A folder without `processor_config.json` takes the processor's settings from the model's `config.json`: a
    damaged one failed with a bare `JSONDecodeError`."""
    folder = copy_of(saved, "rhe", tmp_path)
    (folder / "processor_config.json").unlink()
    (folder / "config.json").write_text('{"model_type": "mgsa",', encoding="utf-8")
    with pytest.raises(DamagedFileError, match=rf"{folder / 'config.json'} is damaged, line 1, column 23: not valid "
                                               "JSON"):
        MgsaProcessor.from_pretrained(folder)


def test_tokenizer_json_that_is_no_tokenizer(saved, tmp_path):
    """JSON that the `tokenizers` library does not read: its error (a bare `Exception` naming a line of no file)
    is kept, under one naming the file."""
    folder = copy_of(saved, "rhe", tmp_path)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}', encoding="utf-8")
    for load in (MgsaProcessor.from_pretrained, lambda folder: pipeline("translation", model=str(folder))):
        with pytest.raises(DamagedFileError, match=rf"{folder / 'tokenizer.json'} is damaged: the `tokenizers` "
                                                   r"library does not read it as a tokenizer \(.*line 1"):
            load(folder)


def test_saved_processor_that_does_not_load_is_not_dropped(saved, tmp_path):
    """A saved processor with a value it refuses: the pipeline of a model that reads no syntax went on with the
    tokenizer alone, without a word; now it gives the processor's own error."""
    folder = copy_of(saved, "transformer", tmp_path)
    settings = json.loads((folder / "processor_config.json").read_text(encoding="utf-8"))
    (folder / "processor_config.json").write_text(json.dumps({**settings, "phrase_levels": "x"}), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"processor saved in {folder} \(processor_config.json\) did not load: "
                                         r"ValueError: phrase_levels must be a positive integer") as error_info:
        pipeline("translation", model=str(folder))
    assert isinstance(error_info.value.__cause__, ValueError)


def test_config_json_of_another_architecture(saved, tmp_path):
    """A Marian model's folder whose `config.json` is a T5 config: the pipeline loaded a T5 of random weights (with a
    load report) and translated with it; `mgsa-hf convert` listed every weight name. Both now name `config.json`."""
    tokenizer = saved["tokenizer"]
    folder = tmp_path / "marian"
    marian = MarianMTModel(MarianConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                        decoder_start_token_id=tokenizer.pad_token_id,
                                        eos_token_id=tokenizer.eos_token_id, **tiny_sizes()))
    marian.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    pipeline("translation", model=str(folder))  # the Marian folder as saved loads
    T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=48, num_layers=1, num_heads=4).save_pretrained(folder)
    with pytest.raises(ValueError, match=rf"model.safetensors holds 0 of the \d+ weights of the model that "
                                         rf"{folder / 'config.json'} describes \(model_type 't5'\)"):
        pipeline("translation", model=str(folder))
    with pytest.raises(SystemExit, match=r"is not a t5 checkpoint this model can take \(t5: the `model_type` of its "
                                         r"config.json\): \d+ weights it does not have"):
        main(["convert", str(folder), str(tmp_path / "converted"), "--encoder-type", "rhe"])


@pytest.mark.parametrize(("content", "match"), [
    (random.Random(0).randbytes(64).replace(b"\n", b" "), r"line 1: not a YAML or JSON text file \(byte 0x"),
    (b"output_dir: runs/x\nmodel: {a: \xff}\n", r"line 2: not a YAML or JSON text file \(byte 0xff"),
    (b"output_dir: runs/x\nmodel: \x01\n", r"line 2: not a YAML or JSON text file \(U\+0001"),
    (b"output_dir: runs/x\nmodel:\n  a: [1, 2\n", r"line 4, column 1: not valid YAML \(expected ',' or ']'"),
])
def test_recipe_that_is_no_yaml(tmp_path, content, match):
    """A binary file given as the recipe failed with a bare `UnicodeDecodeError`, and bad YAML with the YAML
    reader's error (a traceback from `mgsa-hf train`, naming `<unicode string>`)."""
    path = tmp_path / "recipe.yaml"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"training config {path}, {match}") as error_info:
        load_train_config(path)
    assert error_info.value.__cause__ is not None
    with pytest.raises(SystemExit, match=rf"mgsa-hf train: error: training config {path}, line \d"):
        main(["train", str(path)])


def test_row_file_of_bad_json(tmp_path):
    """`model=FILE.json` with bad JSON: a bare `JSONDecodeError` before."""
    path = tmp_path / "row.json"
    path.write_text('{"encoder_type": "rhe",\n "rhe_layers": [0,}\n', encoding="utf-8")
    with pytest.raises(DamagedFileError, match=rf"{path} is damaged, line 2, column \d+: not valid JSON"):
        load_train_config(None, [f"model={path}"])


def test_translate_input_line_that_is_not_utf8(saved, tmp_path):
    """`mgsa-hf translate --input` with a line that is not UTF-8 said `'utf-8' codec can't decode byte 0xff in
    position 13`, of no file nor line."""
    source = tmp_path / "src.en"
    source.write_bytes(b"A man.\nA dog \xff runs.\n")
    with pytest.raises(SystemExit, match=rf"{source}, line 2: not UTF-8 text \(byte 0xff at byte 7 of the line\)"):
        main(["translate", str(saved["transformer"]), "--input", str(source), "--output", str(tmp_path / "out")])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device that is always full)")
def test_translate_output_on_a_full_disk(saved, tmp_path):
    """`mgsa-hf translate --output` on a full disk said `[Errno 28] No space left on device`, naming no file."""
    from mgsa_hf.cli.commands import add_translate_arguments, run_translate

    source = tmp_path / "src.en"
    source.write_text("A man.\nA dog runs.\n", encoding="utf-8")
    parser = argparse.ArgumentParser()
    add_translate_arguments(parser)
    args = parser.parse_args([str(saved["transformer"]), "--input", str(source), "--output", "/dev/full"])
    with pytest.raises(OSError, match="cannot write the translations to /dev/full: No space left on device") as error:
        run_translate(args)
    assert error.value.errno == errno.ENOSPC and error.value.__cause__.errno == errno.ENOSPC


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device that is always full)")
def test_evaluate_output_on_a_full_disk(saved, capsys):
    """`mgsa-hf evaluate --output` on a full disk: the report's path named, not a bare `[Errno 28]`."""
    with pytest.raises(SystemExit, match="cannot write the report to /dev/full: No space left on device"):
        main(["evaluate", str(saved["transformer"]), "--data", str(MULTI30K_DIR), "--max-samples", "2",
              "--output", "/dev/full"])
    assert '"bleu"' in capsys.readouterr().out  # the report was printed before


def test_prepare_on_a_full_disk(tmp_path, monkeypatch):
    """`mgsa-hf prepare` whose Arrow files do not fit the disk said `[Errno 28] No space left on device` (from
    `datasets`' writer, naming no file); it now names the prepared folder."""
    import datasets

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(datasets.DatasetDict, "save_to_disk", full_disk)
    monkeypatch.setattr(datasets.Dataset, "save_to_disk", full_disk)
    prepared = tmp_path / "prepared"
    with pytest.raises(SystemExit, match=rf"mgsa-hf prepare: error: .*preparing the data in {prepared} failed: No "
                                         "space left on device"):
        main(["prepare", "recipe=tiny", f"data={MULTI30K_DIR}", f"prepared_dir={prepared}",
              f"output_dir={tmp_path / 'run'}"])


def test_tree_model_file_nested_too_deeply(tmp_path):
    """A tree model file of deeply nested JSON failed with a bare `RecursionError`."""
    path = tmp_path / "constituency_conversion.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as file:
        file.write("[" * 100_000 + "]" * 100_000)
    with pytest.raises(OSError, match=rf"The tree model file {path} is damaged \(RecursionError") as error_info:
        DependencyToConstituency.load(path)
    assert isinstance(error_info.value.__cause__, RecursionError)
