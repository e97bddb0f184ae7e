"""Checkpoint averaging under every shipped launcher config, and the tokens of one update.

Under `fsdp.yaml` (`SHARDED_STATE_DICT`) a Trainer checkpoint holds no `model.safetensors`, only accelerate's
`pytorch_model_fsdp_0/` (a torch.distributed.checkpoint folder of one `.distcp` file per process): averaging reads the
whole weights back from those shards. Where a configured average cannot be taken, the run says why, in a warning and
in `results.json`. `tokens_per_update` sets gradient accumulation for the number of processes.
"""

import json
import logging
import re
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from accelerate import PartialState
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import save_fsdp_model
from conftest import MULTI30K_DIR, tiny_sizes
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor
from transformers import Seq2SeqTrainingArguments, TrainerCallback

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration
from mgsa_hf.evaluation import FSDP_SHARDED_MODEL, average_checkpoints, load_checkpoint_state
from mgsa_hf.training.config import gradient_accumulation_for_tokens, load_train_config
from mgsa_hf.training.ownership import complete_checkpoints, run_folder
from mgsa_hf.training.run import _training_arguments, train


try:
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
except ImportError:  # accelerate before FSDP2 (1.3, the lowest version allowed) has FSDP1 only
    fsdp2_prepare_model = None

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"
STEPS = (2, 4, 6)

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model() -> MgsaForConditionalGeneration:
    torch.manual_seed(0)  # every process starts from the same weights
    return MgsaForConditionalGeneration(MgsaConfig(**tiny_sizes(
        vocab_size=40, pad_token_id=2, decoder_start_token_id=2, eos_token_id=0, encoder_type="transformer")))


def save_sharded_checkpoints(rank: int, world_size: int, port: int, folder: Path) -> None:
    """In each process: the tiny model sharded with FSDP2 by accelerate, its parameters moved between saves, and saved
    at each of `STEPS` as the Trainer saves an FSDP model under `fsdp.yaml` (accelerate's `save_fsdp_model`, sharded
    state dict); the main process keeps the full weights of each save for the comparison."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    PartialState(cpu=True)  # accelerate's logging asks for it
    try:
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                state_dict_type="SHARDED_STATE_DICT")
        # accelerate shards on GPUs only: the few attributes of an accelerator it reads
        accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None,
                                      device=torch.device("cpu"), is_main_process=rank == 0, mixed_precision="no",
                                      num_processes=world_size, process_index=rank)
        model = fsdp2_prepare_model(accelerator, tiny_model())
        full = {}
        for step in STEPS:
            with torch.no_grad():
                for index, parameter in enumerate(model.parameters()):
                    parameter.add_(0.01 * step * (index + 1))
            save_fsdp_model(plugin, accelerator, model, folder / f"checkpoint-{step}")
            full[step] = {name: (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).clone()
                          for name, tensor in model.state_dict().items()}
        if rank == 0:
            torch.save(full, folder / "full.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(fsdp2_prepare_model is None, reason="this accelerate has no FSDP2 (it came after 1.3)")
def test_sharded_fsdp_checkpoints_average_to_the_mean_of_their_weights(tmp_path):
    """Two processes (gloo on CPU) save three FSDP2 checkpoints as `fsdp.yaml` makes the Trainer save them: no
    `model.safetensors`, a `pytorch_model_fsdp_0/` of one `.distcp` file per process. They count as complete
    checkpoints, and the average of the last two, read in this one process with no process group, is the mean of the
    two saves' full weights, every key of the model, loadable into the plain model."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    processes = torch.multiprocessing.start_processes(save_sharded_checkpoints, args=(2, port, tmp_path), nprocs=2,
                                                      join=False, start_method="fork")
    deadline = time.monotonic() + 120
    while not processes.join(timeout=max(deadline - time.monotonic(), 0)):
        if time.monotonic() >= deadline:
            for process in processes.processes:
                process.kill()
            pytest.fail("the FSDP2 processes did not finish within 120 s")
    assert not dist.is_initialized()
    checkpoints = complete_checkpoints(tmp_path)
    assert [path.name for path in checkpoints] == [f"checkpoint-{step}" for step in STEPS]
    for checkpoint in checkpoints:
        assert not (checkpoint / "model.safetensors").exists()
        assert sorted(path.name for path in (checkpoint / FSDP_SHARDED_MODEL).iterdir()) == [
            ".metadata", "__0_0.distcp", "__1_0.distcp"]

    full = torch.load(tmp_path / "full.pt", weights_only=True)
    averaged = average_checkpoints(checkpoints[-2:])
    assert set(averaged) == set(full[STEPS[-1]])
    for name, last in full[STEPS[-1]].items():
        torch.testing.assert_close(averaged[name], (full[STEPS[-2]][name] + last) / 2, msg=name)
    # the parameters moved between the saves: a mean that is not one of them
    assert not torch.equal(averaged["model.shared.weight"], full[STEPS[-1]]["model.shared.weight"])
    model = tiny_model()
    load_checkpoint_state(model, averaged, "the average")
    torch.testing.assert_close(model.state_dict()["model.shared.weight"], averaged["model.shared.weight"])


def tiny_config(output_dir, *overrides):
    return load_train_config(TINY, [f"data={MULTI30K_DIR}", f"output_dir={output_dir}", "training.eval_strategy=no",
                                    *overrides])


class ShardCheckpoints(TrainerCallback):
    """Leaves each checkpoint as `fsdp.yaml` would: the weights in accelerate's sharded folder (written with
    torch.distributed.checkpoint, as `save_fsdp_model` writes it), no `model.safetensors`; with `use_dcp=False`, in
    per-process files (`pytorch_model_fsdp_0_rank0.bin`) that averaging does not read."""

    def __init__(self, use_dcp: bool = True):
        self.use_dcp, self.saved = use_dcp, {}

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed.checkpoint as dcp

        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        weights = load_file(checkpoint / "model.safetensors")
        self.saved[checkpoint.name] = weights
        if self.use_dcp:
            dcp.save({"model": weights}, storage_writer=dcp.FileSystemWriter(checkpoint / FSDP_SHARDED_MODEL))
        else:
            torch.save(weights, checkpoint / f"{FSDP_SHARDED_MODEL}_rank0.bin")
        (checkpoint / "model.safetensors").unlink()


def test_a_run_averages_its_sharded_checkpoints(tmp_path, caplog):
    """A run whose checkpoints hold FSDP's sharded weights and no `model.safetensors` averages them (before, it
    skipped averaging without a word); the model it keeps is the average or the selected model, as scored."""
    shards = ShardCheckpoints()
    with caplog.at_level(logging.WARNING, logger="mgsa_hf"):
        results, model = train(tiny_config(tmp_path / "model", "training.max_steps=4", "average_last_checkpoints=5"),
                               callbacks=[shards])
    averaging = results["averaging"]
    assert averaging["checkpoints"] == ["checkpoint-2", "checkpoint-4"], averaging
    assert not any((run_folder(tmp_path / "model") / "checkpoints" / name / "model.safetensors").exists()
                   for name in averaging["checkpoints"])
    assert "skipped" not in averaging and "averaging skipped" not in caplog.text
    first, last = (shards.saved[name]["model.shared.weight"] for name in averaging["checkpoints"])
    kept = (first + last) / 2 if averaging["kept_average"] else last
    torch.testing.assert_close(model.state_dict()["model.shared.weight"], kept)


@pytest.mark.parametrize(("overrides", "use_dcp", "expected"), [
    (["training.max_steps=2"], True, r"1 of the run's checkpoints .* \(checkpoint-2\); it takes 2 or more; save more"),
    (["training.max_steps=4"], False, r"0 of the run's checkpoints .* \(none\).*checkpoint-2, checkpoint-4 hold "
                                      r"neither model.safetensors nor FSDP's sharded pytorch_model_fsdp_0/"),
], ids=["one-checkpoint", "unread-layout"])
def test_an_average_that_cannot_be_taken_is_reported(tmp_path, caplog, overrides, use_dcp, expected):
    """`average_last_checkpoints` with fewer than 2 checkpoints to average (one saved, or weights in a layout it does
    not read) keeps the selected model and says why: a warning, and `averaging.skipped` in `results.json`."""
    with caplog.at_level(logging.WARNING, logger="mgsa_hf"):
        results, _ = train(tiny_config(tmp_path / "model", "average_last_checkpoints=5", *overrides),
                           callbacks=[ShardCheckpoints(use_dcp)])
    recorded = json.loads((run_folder(tmp_path / "model") / "results.json").read_text())
    assert recorded["averaging"] == results["averaging"] and set(recorded["averaging"]) == {"skipped"}
    assert re.search(expected, recorded["averaging"]["skipped"]), recorded["averaging"]
    assert "checkpoint averaging skipped: " + recorded["averaging"]["skipped"] in caplog.text


@pytest.mark.parametrize(("world_size", "accumulation"), [(1, 7), (2, 4), (8, 1)])
def test_tokens_per_update_sets_gradient_accumulation_for_the_processes(tmp_path, monkeypatch, world_size,
                                                                       accumulation):
    """`tokens_per_update` gives ⌈tokens / (max_tokens_per_batch × processes)⌉ accumulated batches: the `wmt14`
    recipe's 25000 tokens with 4096-token batches, and the training arguments of a run on 1, 2 or 8 processes."""
    wmt14 = load_train_config("wmt14")
    assert (wmt14.tokens_per_update, wmt14.max_tokens_per_batch) == (25000, 4096)
    assert gradient_accumulation_for_tokens(wmt14, world_size) == accumulation

    monkeypatch.setattr(Seq2SeqTrainingArguments, "world_size", property(lambda self: world_size))
    args = _training_arguments(tiny_config(tmp_path, "max_tokens_per_batch=300", "tokens_per_update=2000"))
    assert args.world_size == world_size
    assert args.gradient_accumulation_steps == -(-2000 // (300 * world_size))
    # an explicit value that agrees is kept
    args = _training_arguments(tiny_config(tmp_path, "max_tokens_per_batch=300", "tokens_per_update=2000",
                                           f"training.gradient_accumulation_steps={-(-2000 // (300 * world_size))}"))
    assert args.gradient_accumulation_steps == -(-2000 // (300 * world_size))


@pytest.mark.parametrize(("overrides", "expected"), [
    (["training.gradient_accumulation_steps=2"],
     r"`tokens_per_update=2000` .* `training.gradient_accumulation_steps=7`, but "
     r"`training.gradient_accumulation_steps=2` is set"),
    (["max_tokens_per_batch=null"], r"`tokens_per_update=2000` counts token batches: set `max_tokens_per_batch`"),
    (["tokens_per_update=0"], r"`tokens_per_update` must be a positive whole number of tokens, got 0"),
    (["tokens_per_update=many"], r"`tokens_per_update` must be a positive whole number of tokens, got 'many'"),
    (["tokens_per_update=null", "training.tokens_per_update=2000"],
     r"unknown `training` key\(s\) \['tokens_per_update'\].*a key of its own, beside `max_tokens_per_batch`"),
], ids=["disagrees", "sentence-batches", "zero", "text", "in-training"])
def test_tokens_per_update_errors_name_the_keys(tmp_path, overrides, expected):
    """`tokens_per_update` with an explicit `training.gradient_accumulation_steps` that disagrees, without token
    batches, or not a positive count stops before any work, naming the keys."""
    with pytest.raises(ValueError, match=expected):  # when the recipe is loaded, or when the run's arguments are made
        _training_arguments(tiny_config(tmp_path, "max_tokens_per_batch=300", "tokens_per_update=2000", *overrides))


class CountBatches(TrainerCallback):
    """The batches a run trains on: each update's last (`on_step_end`) and the ones before it (`on_substep_end`)."""

    def __init__(self):
        self.batches = self.updates = 0

    def on_substep_end(self, args, state, control, **kwargs):
        self.batches += 1

    def on_step_end(self, args, state, control, **kwargs):
        self.batches, self.updates = self.batches + 1, self.updates + 1


def test_a_run_records_its_tokens_per_update(tmp_path, caplog):
    """A run with `tokens_per_update` trains each update on the derived number of token batches and records the most
    tokens of one update (`max_tokens_per_batch` × processes × accumulation) in its log and `results.json`."""
    counter = CountBatches()
    with caplog.at_level(logging.INFO, logger="mgsa_hf"):
        results, _ = train(tiny_config(tmp_path / "model", "training.max_steps=2", "max_tokens_per_batch=300",
                                       "tokens_per_update=700"), callbacks=[counter])
    assert (counter.updates, counter.batches) == (2, 6)  # ⌈700 / 300⌉ = 3 batches an update
    recorded = json.loads((run_folder(tmp_path / "model") / "results.json").read_text())
    assert results["tokens_per_update"] == recorded["tokens_per_update"] == 900
    assert results["gradient_accumulation_steps"] == recorded["gradient_accumulation_steps"] == 3
    assert "tokens per update: at most 900 per side (300 per batch x 1 processes x 3 accumulated batches; " \
           "tokens_per_update=700)" in caplog.text
