"""Resuming from a checkpoint of another run (another backbone, encoder type, sizes, vocabulary or training data) stops
before any step, naming the checkpoint and what differs; a checkpoint of the same run resumes."""

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_DIR
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast, Seq2SeqTrainingArguments, default_data_collator

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration, MgsaT5Config, MgsaT5ForConditionalGeneration
from mgsa_hf.training.resume_checks import RUN_INPUTS
from mgsa_hf.training.trainer import MgsaSeq2SeqTrainer


SPECIAL = ["</s>", "<unk>", "<pad>"]
SIZES = dict(vocab_size=40, pad_token_id=2, decoder_start_token_id=2, eos_token_id=0)
MARIAN = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
              encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)


def tokenizer(reverse: bool = False) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of 40 tokens; `reverse`: the same words under other ids (another vocabulary)."""
    words = [f"w{i}" for i in range(40 - len(SPECIAL))]
    vocab = {token: i for i, token in enumerate(SPECIAL + (words[::-1] if reverse else words))}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>", pad_token="<pad>")


def pairs(seed: int = 0, rows: int = 8) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(3, 40, (6,), generator=generator), "attention_mask": torch.ones(6, dtype=int),
             "labels": torch.randint(3, 40, (5,), generator=generator)} for _ in range(rows)]


def marian(**fields) -> MgsaForConditionalGeneration:
    torch.manual_seed(0)
    return MgsaForConditionalGeneration(MgsaConfig(**{"encoder_type": "transformer", **SIZES, **MARIAN, **fields}))


def t5() -> MgsaT5ForConditionalGeneration:
    torch.manual_seed(0)
    return MgsaT5ForConditionalGeneration(MgsaT5Config(encoder_type="transformer", d_model=16, d_kv=8, d_ff=32,
                                                       num_layers=1, num_decoder_layers=1, num_heads=2, **SIZES))


def trainer_for(output_dir, model, processing_class, data, max_steps: int) -> MgsaSeq2SeqTrainer:
    arguments = Seq2SeqTrainingArguments(output_dir=str(output_dir), report_to=[], use_cpu=True, max_steps=max_steps,
                                         save_steps=1, per_device_train_batch_size=4, disable_tqdm=True)
    return MgsaSeq2SeqTrainer(model=model, args=arguments, train_dataset=data, processing_class=processing_class,
                              data_collator=default_data_collator)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint-1 of a one-step run: a Marian-style transformer, the 40-word vocabulary, 8 pairs."""
    folder = tmp_path_factory.mktemp("run")
    trainer_for(folder, marian(), tokenizer(), pairs(), 1).train()
    return folder / "checkpoint-1"


def test_a_checkpoint_records_the_runs_vocabulary_and_data(checkpoint, tmp_path):
    record = json.loads((checkpoint / RUN_INPUTS).read_text())
    assert record["training_data"]["rows"] == 8 and record["vocabulary"]["tokens"] == 40
    trainer = trainer_for(tmp_path, marian(), tokenizer(), pairs(), 2)
    assert trainer.train(resume_from_checkpoint=str(checkpoint)).global_step == 2


OTHER_RUNS = {
    "encoder type": (lambda: (marian(encoder_type="rhe"), tokenizer(), pairs()), r"encoder_type transformer -> rhe"),
    "backbone": (lambda: (t5(), tokenizer(), pairs()), r"model_type \(the backbone\) mgsa -> mgsa_t5"),
    "sizes": (lambda: (marian(d_model=32, encoder_ffn_dim=64), tokenizer(), pairs()),
              r"d_model 16 -> 32; encoder_ffn_dim 32 -> 64"),
    "vocabulary": (lambda: (marian(), tokenizer(reverse=True), pairs()),
                   r"the vocabulary \(another tokenizer of 40 tokens\)"),
    "data": (lambda: (marian(), tokenizer(), pairs(seed=1)), r"the training data \(other rows, 8 of them\)"),
    "fewer rows": (lambda: (marian(), tokenizer(), pairs(rows=6)), r"the training data \(8 -> 6 rows\)"),
}


@pytest.mark.parametrize("other", list(OTHER_RUNS))
def test_another_runs_checkpoint_is_refused_before_any_step(checkpoint, tmp_path, other):
    """Before: another encoder type or backbone failed loading the optimizer state ("loaded state dict contains a
    parameter group that doesn't match the size of optimizer's group"), naming nothing; another vocabulary or other
    data resumed without a word."""
    make, differs = OTHER_RUNS[other]
    trainer = trainer_for(tmp_path, *make(), 2)
    with pytest.raises(ValueError, match=rf"resume_from_checkpoint='{re.escape(str(checkpoint))}': the checkpoint "
                                         rf"belongs to another run \(the checkpoint's -> this run's\): {differs}\."):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.state.global_step == 0 and not list(tmp_path.iterdir())


def test_a_checkpoint_without_the_record_is_still_compared_by_its_config(checkpoint, tmp_path, caplog):
    """A checkpoint saved before checkpoints held `run_inputs.json` (or with the record damaged, which is named):
    its `config.json` is still compared; the vocabulary and data cannot be."""
    import shutil

    older = tmp_path / "older" / "checkpoint-1"
    shutil.copytree(checkpoint, older)
    (older / RUN_INPUTS).unlink()
    with pytest.raises(ValueError, match=r"another run .*: encoder_type transformer -> rhe\."):
        trainer_for(tmp_path / "rhe", marian(encoder_type="rhe"), tokenizer(), pairs(), 2).train(str(older))
    (older / RUN_INPUTS).write_text("{\"vocabulary\": ", encoding="utf-8")
    trainer = trainer_for(tmp_path / "same", marian(), tokenizer(), pairs(seed=1), 2)
    assert trainer.train(resume_from_checkpoint=str(older)).global_step == 2
    assert f"{older / RUN_INPUTS} cannot be read" in caplog.text


TINY_RECIPE = Path(__file__).resolve().parents[1] / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"


def recipe(output_dir, *overrides):
    """The tiny recipe without evaluation: one step, a checkpoint at each step."""
    from mgsa_hf.training.config import load_train_config

    return load_train_config(TINY_RECIPE, [f"data={MULTI30K_DIR}", f"output_dir={output_dir}", "training.max_steps=1",
                                           "training.eval_strategy=no", "training.save_steps=1", *overrides])


# a recipe changed in the model, the data or the backbone, and what the error names
OTHER_RECIPES = [
    (["model.encoder_type=hybrid"], r"encoder_type transformer -> hybrid"),
    (["max_train_samples=48"],
     r"the vocabulary \(another tokenizer of 300 tokens\); the training data \(64 -> 48 rows\)"),
    (["backbone=t5", "model={}"], r"model_type \(the backbone\) mgsa -> mgsa_t5"),
]


def test_a_recipe_resuming_another_runs_checkpoint_stops_before_any_step(tmp_path):
    """`mgsa-hf train ... resume_from_checkpoint=<another run's checkpoint>`: the error names the checkpoint and what
    differs; the run saves no checkpoint. The run's own checkpoint resumes."""
    from mgsa_hf.training.ownership import run_folder
    from mgsa_hf.training.run import train

    train(recipe(tmp_path / "first"))
    checkpoint = run_folder(tmp_path / "first") / "checkpoints" / "checkpoint-1"
    resume = [f"resume_from_checkpoint={checkpoint}", "training.max_steps=2"]
    for number, (overrides, differs) in enumerate(OTHER_RECIPES):
        refused = (rf"resume_from_checkpoint='{re.escape(str(checkpoint))}': the checkpoint belongs to another run "
                   rf".*: {differs}\. Resume with that run's")
        with pytest.raises(ValueError, match=refused):
            train(recipe(tmp_path / f"other{number}", *resume, *overrides))
        assert not list((run_folder(tmp_path / f"other{number}") / "checkpoints").glob("checkpoint-*"))
    results, _ = train(recipe(tmp_path / "first", *resume))
    assert results["global_step"] == 2
