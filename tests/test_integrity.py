"""Nothing read or written without a word: every read of a saved folder checks its `weights.sha256` (loading,
resuming, averaging), and every command that writes a folder refuses one that holds something else unless told to
replace it (`--overwrite`)."""

import json
import re
import struct
from pathlib import Path

import pytest
import torch
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


def test_a_flipped_byte_is_refused_by_name_on_load_and_averaging(saved):
    MgsaForConditionalGeneration.from_pretrained(saved)  # intact: loads
    flip_a_weight_byte(saved / "model.safetensors")
    message = rf"{named(saved / 'model.safetensors')} does not hold the weights that were saved"
    with pytest.raises(ValueError, match=message):
        MgsaForConditionalGeneration.from_pretrained(saved)
    with pytest.raises(ValueError, match=message):
        average_checkpoints([saved])


def test_a_record_naming_only_a_missing_shard_does_not_let_a_damaged_file_load(saved):
    """A record that lists only a shard the folder lacks checked nothing, and a damaged `model.safetensors` beside
    it loaded; now the missing shard is named, on load and in averaging."""
    (saved / "weights.sha256").write_text(f"{'0' * 64}  model-00001-of-00002.safetensors\n")
    flip_a_weight_byte(saved / "model.safetensors")
    message = rf"{named(saved / 'model-00001-of-00002.safetensors')} is missing"
    with pytest.raises(ValueError, match=message):
        MgsaForConditionalGeneration.from_pretrained(saved)
    with pytest.raises(ValueError, match=message):
        average_checkpoints([saved])


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
