"""A run stopped while saving its model, after its checkpoint at `max_steps`, resumes without training past it."""

import argparse
import json

import pytest
import torch
from conftest import MULTI30K_DIR
from transformers import AutoModelForSeq2SeqLM

from mgsa_hf.training import run as run_module
from mgsa_hf.training.catalogue import recipe_path
from mgsa_hf.training.ownership import run_folder


class Killed(BaseException):
    """Stands for the process killed while it saves (nothing after it runs)."""


def test_resume_after_a_kill_in_the_final_save_trains_no_step(tmp_path, monkeypatch):
    """`max_steps=3` ends in the middle of the first epoch (4 batches): the Trainer checkpoints step 3, then the run is
    killed saving its model folder. Resumed, the Trainer went on with the epoch's fourth batch (it checks `max_steps`
    after a step): step 4 and a `checkpoint-4`. Now it trains none and saves the weights of `checkpoint-3`."""
    overrides = [f"data={MULTI30K_DIR}", f"output_dir={tmp_path}", "training.max_steps=3",
                 "training.eval_strategy=no"]

    def killed(*args, **kwargs):
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(run_module, "_save", killed)
        try:
            run_module.run_train(argparse.Namespace(config=str(recipe_path("tiny")), overrides=overrides))
        except Killed:
            pass
    checkpoints = run_folder(tmp_path) / "checkpoints"
    assert sorted(path.name for path in checkpoints.iterdir()) == ["checkpoint-2", "checkpoint-3"]
    assert not (tmp_path / "model.safetensors").exists()

    results = run_module.run_train(argparse.Namespace(config=str(recipe_path("tiny")),
                                                      overrides=[*overrides, "resume_from_checkpoint=true"]))
    assert results["global_step"] == 3
    logged = [(entry["step"], entry["loss"]) for entry in json.loads(
        (checkpoints / "checkpoint-3" / "trainer_state.json").read_text())["log_history"] if "loss" in entry]
    assert [step for step, _ in logged] == [2, 3]  # the run's loss is its log's, not 0 for no step trained
    assert results["train_loss"] == pytest.approx((2 * logged[0][1] + logged[1][1]) / 3)
    assert sorted(path.name for path in checkpoints.iterdir()) == ["checkpoint-2", "checkpoint-3"]
    saved = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).state_dict()
    last = AutoModelForSeq2SeqLM.from_pretrained(checkpoints / "checkpoint-3").state_dict()
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, last[name], atol=0, rtol=0, msg=name)
