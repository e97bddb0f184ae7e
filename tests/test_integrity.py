"""Nothing read or written without a word: every read of a saved folder checks its `weights.sha256` (loading,
resuming, averaging), and every command that writes a folder refuses one that holds something else unless told to
replace it (`--overwrite`)."""

import json
import re
import struct
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_DIR
from transformers import Seq2SeqTrainingArguments, default_data_collator

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration
from mgsa_hf.evaluation import average_checkpoints
from mgsa_hf.training.trainer import MgsaSeq2SeqTrainer


pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(vocab_size=40, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, d_model=16, encoder_layers=1,
            decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
            decoder_ffn_dim=32, max_position_embeddings=32, dropout=0.0, attention_dropout=0.0)


def tiny_model() -> MgsaForConditionalGeneration:
    torch.manual_seed(0)
    return MgsaForConditionalGeneration(MgsaConfig(encoder_type="transformer", **TINY))


def flip_a_weight_byte(path: Path) -> None:
    """Flip one byte in the data part of a safetensors file (past its JSON header): safetensors still reads it."""
    data = bytearray(path.read_bytes())
    header_size = struct.unpack("<Q", data[:8])[0]
    data[8 + header_size + (len(data) - 8 - header_size) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def named(path: Path) -> str:
    return re.escape(str(path))


# --- weights.sha256 checked on every read ---


@pytest.fixture
def saved(tmp_path) -> Path:
    folder = tmp_path / "saved"
    tiny_model().save_pretrained(folder)
    return folder


def assert_refused_on_load_and_averaging(saved, message: str) -> None:
    for read in (MgsaForConditionalGeneration.from_pretrained, lambda folder: average_checkpoints([folder])):
        with pytest.raises(ValueError, match=message):
            read(saved)


def test_a_flipped_byte_is_refused_by_name_on_load_and_averaging(saved):
    MgsaForConditionalGeneration.from_pretrained(saved)  # intact: loads
    flip_a_weight_byte(saved / "model.safetensors")
    assert_refused_on_load_and_averaging(
        saved, rf"{named(saved / 'model.safetensors')} does not hold the weights that were saved")


def test_a_record_naming_only_a_missing_shard_does_not_let_a_damaged_file_load(saved):
    """A record that lists only a shard the folder lacks checked nothing, and a damaged `model.safetensors` beside
    it loaded; now the missing shard is named, on load and in averaging."""
    (saved / "weights.sha256").write_text(f"{'0' * 64}  model-00001-of-00002.safetensors\n")
    flip_a_weight_byte(saved / "model.safetensors")
    assert_refused_on_load_and_averaging(saved, rf"{named(saved / 'model-00001-of-00002.safetensors')} is missing")


def test_a_weights_file_the_record_does_not_name_is_refused(saved):
    """A weights file the save did not write (copied in later) would be read unchecked."""
    (saved / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(ValueError, match=rf"{named(saved / 'model.safetensors.index.json')} is not in "):
        MgsaForConditionalGeneration.from_pretrained(saved)
    (saved / "model.safetensors.index.json").unlink()
    (saved / "model.safetensors").rename(saved / "model.fp16.safetensors")  # renamed: listed one gone, other unlisted
    with pytest.raises(ValueError, match=rf"{named(saved / 'model.safetensors')} is missing"):
        MgsaForConditionalGeneration.from_pretrained(saved)


def trainer_for(output_dir: Path, max_steps: int) -> MgsaSeq2SeqTrainer:
    """A tiny model's trainer on 8 equal-length pairs, saving a checkpoint every step."""
    generator = torch.Generator().manual_seed(0)
    pairs = [{"input_ids": torch.randint(2, 40, (6,), generator=generator), "attention_mask": torch.ones(6, dtype=int),
              "labels": torch.randint(2, 40, (5,), generator=generator)} for _ in range(8)]
    arguments = Seq2SeqTrainingArguments(output_dir=str(output_dir), report_to=[], use_cpu=True, max_steps=max_steps,
                                         save_steps=1, per_device_train_batch_size=4, logging_steps=1)
    return MgsaSeq2SeqTrainer(model=tiny_model(), args=arguments, train_dataset=pairs,
                              data_collator=default_data_collator)


def test_resuming_from_a_damaged_checkpoint_is_refused_by_name(tmp_path):
    """The Trainer reads a checkpoint's weights with safetensors, which checks the header only: a flipped byte in
    `model.safetensors` trained on without a word."""
    trainer_for(tmp_path, 1).train()
    checkpoint = tmp_path / "checkpoint-1"
    assert (checkpoint / "weights.sha256").is_file()
    assert trainer_for(tmp_path / "intact", 2).train(resume_from_checkpoint=str(checkpoint)).global_step == 2
    flip_a_weight_byte(checkpoint / "model.safetensors")
    message = rf"resuming from {named(checkpoint)}: {named(checkpoint / 'model.safetensors')} does not hold"
    with pytest.raises(ValueError, match=message):
        trainer_for(tmp_path / "other", 2).train(resume_from_checkpoint=str(checkpoint))
    with pytest.raises(ValueError, match=message):
        trainer_for(tmp_path, 2).train(resume_from_checkpoint=True)
    trainer = trainer_for(tmp_path / "other", 2)  # `load_best_model_at_end` reads the best checkpoint the same way
    trainer.state.best_model_checkpoint = str(checkpoint)
    with pytest.raises(ValueError, match=rf"loading the best model of {named(checkpoint)}: .*does not hold"):
        trainer._load_best_model()


# --- commands that write a folder refuse one holding something else ---


def listing(folder: Path) -> dict[str, int]:
    """Every file under `folder` with its modification time: what a refused command must leave as it was."""
    return {str(path.relative_to(folder)): path.stat().st_mtime_ns for path in sorted(folder.rglob("*"))}


def test_convert_into_a_folder_holding_another_model_is_refused_unless_overwrite(saved, tmp_path):
    """`mgsa-hf convert SRC X` replaced the model X held and exited 0."""
    from mgsa_hf.cli import main

    other = tmp_path / "other"
    MgsaForConditionalGeneration(MgsaConfig(encoder_type="transformer", **{**TINY, "vocab_size": 50})).save_pretrained(
        other)
    (other / "tokenizer.json").write_text("{}")  # the other model's processor, which the source has none of
    (other / "notes.txt").write_text("the user's")
    before = listing(other)
    with pytest.raises(SystemExit, match=rf"mgsa-hf convert: error: {named(other)} is not empty .*pass --overwrite"):
        main(["convert", str(saved), str(other)])
    assert listing(other) == before
    main(["convert", str(saved), str(other), "--overwrite"])
    assert json.loads((other / "config.json").read_text())["vocab_size"] == 40  # the source's model
    assert not (other / "tokenizer.json").exists()  # replaced whole: no processor of the other model left
    assert (other / "notes.txt").read_text() == "the user's"
    MgsaForConditionalGeneration.from_pretrained(other)
    main(["convert", str(saved), str(tmp_path / "new")])  # a new (or empty) folder needs no option
    assert (tmp_path / "new" / "model.safetensors").is_file()


@pytest.mark.parametrize("command", [["convert"], ["export", "onnx"], ["export", "ct2"]])
def test_writing_into_the_folder_read_is_refused_before_anything_is_written(saved, command):
    """`export onnx` into the model's own folder wrote its graphs and then failed with `shutil.SameFileError`;
    `export ct2 --force` into it removed the model. Refused up front, with or without `--overwrite`."""
    pytest.importorskip("onnxruntime" if "onnx" in command else "ctranslate2" if "ct2" in command else "torch")
    from mgsa_hf.cli import main

    before = listing(saved)
    for extra in ([], ["--overwrite"]):
        with pytest.raises(SystemExit, match=rf"the output folder {named(saved)} is the folder read"):
            main([*command, str(saved), str(saved), *extra])
        with pytest.raises(SystemExit, match=rf"the output folder {named(saved.parent)} holds the folder read"):
            main([*command, str(saved), str(saved.parent), *extra])
    assert listing(saved) == before


@pytest.mark.parametrize("command", [["export", "onnx"], ["export", "ct2"]])
def test_export_into_a_non_empty_folder_is_refused_naming_the_option(saved, tmp_path, command):
    pytest.importorskip("onnxruntime" if "onnx" in command else "ctranslate2")
    from mgsa_hf.cli import main

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.bin").write_text("an earlier export")
    with pytest.raises(SystemExit, match=r"out is not empty \(it holds model.bin\).* pass --overwrite"):
        main([*command, str(saved), str(tmp_path / "out")])
    assert (tmp_path / "out" / "model.bin").read_text() == "an earlier export"


def test_overwrite_output_dir_removes_the_earlier_runs_files_only(tmp_path):
    """`overwrite_output_dir=true` removed the whole model folder, the user's files in it included."""
    from mgsa_hf.training.ownership import own_run_folders, run_folder

    output_dir, run_dir = tmp_path / "model", run_folder(tmp_path / "model")
    tiny_model().save_pretrained(output_dir)  # the earlier run's model, with the package's code files
    (output_dir / "tokenizer.json").write_text("{}")
    (output_dir / "README.md").write_text("the earlier run's card")
    (output_dir / "notes.txt").write_text("the user's")
    (output_dir / "plots").mkdir()
    (output_dir / "plots" / "loss.png").write_bytes(b"png")
    run_dir.mkdir()
    (run_dir / "results.json").write_text("{}")
    assert any(path.suffix == ".py" for path in output_dir.iterdir())
    with own_run_folders(output_dir, overwrite=True):
        assert sorted(path.name for path in output_dir.iterdir()) == ["notes.txt", "plots"]
        assert (output_dir / "plots" / "loss.png").read_bytes() == b"png"
        assert not (run_dir / "results.json").exists()


def test_push_to_hub_with_the_hub_unreachable_keeps_the_saved_run(tmp_path, monkeypatch):
    """The repository was made after training and scoring but before the model folder was saved: a Hub out of reach
    lost the model and `results.json`. Now both are saved first, and the error names the folder and how to publish
    it later."""
    from huggingface_hub import HfApi

    from mgsa_hf.training.config import load_train_config
    from mgsa_hf.training.ownership import run_folder
    from mgsa_hf.training.run import train

    def unreachable(*args, **kwargs):
        raise ConnectionError("Max retries exceeded with url: /api/repos/create")

    monkeypatch.setattr(HfApi, "create_repo", unreachable)
    recipe = Path(__file__).resolve().parents[1] / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"
    folder = tmp_path / "pushed"
    config = load_train_config(recipe, [f"data={MULTI30K_DIR}", f"output_dir={folder}", "training.max_steps=1",
                                        "training.eval_strategy=no", "training.push_to_hub=true",
                                        "training.hub_model_id=team/pushed"])
    with pytest.raises(OSError, match=rf"Nothing is lost: the model is saved at {named(folder)}.*"
                                      rf"`hf upload team/pushed {named(folder)}`"):
        train(config)
    MgsaForConditionalGeneration.from_pretrained(folder)
    results = json.loads((run_folder(folder) / "results.json").read_text())
    assert results["global_step"] == 1 and "hub_repo_id" not in results
    assert 'model="team/pushed"' in (folder / "README.md").read_text()


def test_export_ct2_overwrite_replaces_the_export_and_keeps_other_files(tmp_path):
    """CTranslate2's own `force` removed the whole folder before writing; `--overwrite` (or the former `--force`)
    replaces the earlier export's files only, and the export is swapped in whole."""
    pytest.importorskip("ctranslate2")
    from mgsa_hf import MgsaProcessor
    from mgsa_hf.cli import main
    from mgsa_hf.tokenization_utils import train_joint_tokenizer

    for lang, text in (("en", "A man rides a bike.\nTwo dogs play.\n"), ("de", "Ein Mann fährt.\nZwei Hunde.\n")):
        (tmp_path / f"a.{lang}").write_text(text)
    tokenizer = train_joint_tokenizer(tmp_path / "a.en", tmp_path / "a.de", tmp_path / "tokenizer", vocab_size=60)
    config = MgsaConfig(encoder_type="transformer", **{**TINY, "vocab_size": len(tokenizer),
                                                       "pad_token_id": tokenizer.pad_token_id,
                                                       "eos_token_id": tokenizer.eos_token_id,
                                                       "decoder_start_token_id": tokenizer.pad_token_id})
    MgsaForConditionalGeneration(config).save_pretrained(tmp_path / "model")
    MgsaProcessor(tokenizer, with_syntax=False).save_pretrained(tmp_path / "model")
    out = tmp_path / "ct2"
    main(["export", "ct2", str(tmp_path / "model"), str(out)])
    (out / "notes.txt").write_text("the user's")
    (out / "source_vocabulary.json").write_text("[] an earlier export's")
    with pytest.raises(SystemExit, match=r"pass --overwrite"):
        main(["export", "ct2", str(tmp_path / "model"), str(out)])
    for option in ("--overwrite", "--force"):
        main(["export", "ct2", str(tmp_path / "model"), str(out), option])
        assert sorted(path.name for path in out.iterdir()) == ["config.json", "model.bin", "notes.txt",
                                                               "shared_vocabulary.json"]
    assert not list(tmp_path.glob(".ct2*"))  # no staging folder left
