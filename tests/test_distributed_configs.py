"""The packaged `accelerate launch` configs for several GPUs (`mgsa-hf accelerate-config`), checked on CPU: FSDP's
wrap policy, resolved by accelerate from `fsdp.yaml` as `accelerate launch` passes it on, finds the layer classes of
every encoder type on both backbones; two processes (gloo) in which accelerate shards a model with FSDP2 train it, and
the end of a run gathers it, translates, saves and reloads it; DeepSpeed takes gradient accumulation and clipping from
the training arguments; DDP does not search for unused parameters where every parameter is used."""

import copy
import json
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
from conftest import tiny_sizes
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration, MgsaT5Config, MgsaT5ForConditionalGeneration
from mgsa_hf.training.catalogue import ACCELERATE_CONFIGS
from mgsa_hf.training.distributed import ddp_find_unused_parameters, fsdp_modules, model_for_main_process


try:
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy, fsdp2_prepare_model
except ImportError:  # accelerate before FSDP2 (1.3, the lowest version allowed) has FSDP1 only
    fsdp2_prepare_auto_wrap_policy = fsdp2_prepare_model = None


ENCODER_TYPES = ["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"]

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(backbone: str, encoder_type: str, **fields):
    fields = {**dict(vocab_size=64, pad_token_id=2, decoder_start_token_id=2, eos_token_id=0), **fields,
              "encoder_type": encoder_type}
    if backbone == "t5":
        return MgsaT5ForConditionalGeneration(MgsaT5Config(
            d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0, **fields))
    return MgsaForConditionalGeneration(MgsaConfig(**tiny_sizes(**fields)))


def layers(model) -> dict[str, torch.nn.Module]:
    """The encoder and decoder layers (Marian) or blocks (T5) of `model`, by name."""
    stacks = {"encoder": model.get_encoder(), "decoder": model.get_decoder()}
    prefix = "model." if isinstance(model, MgsaForConditionalGeneration) else ""
    return {f"{prefix}{side}.{'layers' if prefix else 'block'}.{index}": layer for side, stack in stacks.items()
            for index, layer in enumerate(getattr(stack, "layers", None) or stack.block)}


def launch_environment(config: Path, prepare) -> dict[str, str]:
    """The environment `accelerate launch --config_file config` gives the processes (ACCELERATE_* and FSDP_*)."""
    args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args(
        ["--config_file", str(config), "train.py"]))
    if defaults.deepspeed_config:  # as `accelerate launch` does before starting DeepSpeed
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    environment = prepare(args)
    environment = environment[1] if isinstance(environment, tuple) else environment
    return {key: value for key, value in environment.items() if key.startswith(("ACCELERATE_", "FSDP_"))}


@pytest.fixture(scope="module")
def fsdp_environment():
    environment = launch_environment(ACCELERATE_CONFIGS / "fsdp.yaml", prepare_multi_gpu_env)
    # the plugin asks a GPU for its index when it is to load on rank 0 only and broadcast: a loading setting (not
    # the wrap policy's), which the CPU cannot answer
    return {**environment, "FSDP_CPU_RAM_EFFICIENT_LOADING": "false", "FSDP_SYNC_MODULE_STATES": "false"}


@pytest.mark.parametrize("encoder_type", ENCODER_TYPES)
@pytest.mark.parametrize("backbone", ["marian", "t5"])
def test_fsdp_config_wraps_every_layer(fsdp_environment, monkeypatch, backbone, encoder_type):
    """`fsdp.yaml` names no layer class: accelerate takes the model's `_no_split_modules`, the classes of its own
    layers (PR's carry the variant's mixin), and wraps each encoder and decoder layer; FSDP1 (all that accelerate
    1.3 has) resolves the same classes."""
    for name, value in fsdp_environment.items():
        monkeypatch.setenv(name, value)
    model = tiny_model(backbone, encoder_type)
    expected = layers(model)
    assert sorted(model._no_split_modules) == sorted({type(layer).__name__ for layer in expected.values()})

    if fsdp2_prepare_auto_wrap_policy is not None:
        plugin = FullyShardedDataParallelPlugin()
        assert (plugin.fsdp_version, plugin.transformer_cls_names_to_wrap) == (2, None)
        policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
        assert [name for name, module in model.named_modules() if policy(module)] == list(expected)

    fsdp1 = FullyShardedDataParallelPlugin(**({"fsdp_version": 1} if fsdp2_prepare_model is not None else {}))
    fsdp1.set_auto_wrap_policy(model)
    assert fsdp1.auto_wrap_policy.keywords["transformer_layer_cls"] == {type(layer) for layer in expected.values()}


def test_deepspeed_config_takes_the_training_arguments(monkeypatch):
    """`deepspeed_zero2.yaml` leaves gradient accumulation and clipping to the Trainer (`auto`: its
    `gradient_accumulation_steps` and `max_grad_norm`) instead of fixing 1 and 1.0 against them."""
    environment = launch_environment(ACCELERATE_CONFIGS / "deepspeed_zero2.yaml", prepare_deepspeed_cmd_env)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    config = DeepSpeedPlugin().deepspeed_config
    assert (config["gradient_accumulation_steps"], config["gradient_clipping"]) == ("auto", "auto")
    assert config["zero_optimization"]["stage"] == 2


VOCAB, PAD, EOS = 40, 2, 0


def random_batch(seed: int) -> dict:
    ids = torch.randint(3, VOCAB, (4, 7), generator=torch.Generator().manual_seed(seed))
    ids[:, -1] = EOS
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.flip(1).roll(-1, 1)}


def fsdp2_run(backbone: str, output_dir: Path, rank: int) -> dict:
    """In each process: a PR model (fixed-size phrases, no parse) sharded with FSDP2 by accelerate's own
    `fsdp2_prepare_model` (each layer by the wrap policy, the embeddings with the head, then the model; accelerate
    shards on GPUs only, so it gets the few attributes of an accelerator it reads), 3 training steps on batches of the
    process's own, then the end of a run as [`mgsa_hf.training.train`] ends one; the main process translates, saves
    and reloads."""
    from transformers import AutoModelForSeq2SeqLM

    torch.manual_seed(0)  # every process starts from the same weights
    model = tiny_model(backbone, "phrase_representation", vocab_size=VOCAB, pad_token_id=PAD,
                       decoder_start_token_id=PAD, eos_token_id=EOS)
    initial = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    reference = copy.deepcopy(model)  # trained in one process on both processes' batches, for the comparison
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None,
                                  device=torch.device("cpu"), is_main_process=rank == 0, mixed_precision="no")
    model = fsdp2_prepare_model(accelerator, model)
    wrapped = [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for step in range(3):
        model(**random_batch(100 * rank + step)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        # FSDP averages the processes' gradients
        sum(reference(**random_batch(100 * other + step)).loss for other in range(2)).div(2).backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    # what the shards hold, gathered parameter by parameter (every process takes part)
    trained = {name: tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
               for name, tensor in model.state_dict().items()}
    full = model_for_main_process(model)  # every process
    record = {"wrapped": wrapped, "own_model_back": full is model}
    if rank == 0:
        inputs = {name: value for name, value in random_batch(7).items() if name != "labels"}
        translations = full.generate(**inputs, max_length=8, num_beams=2)
        full.save_pretrained(output_dir / backbone)
        reloaded = AutoModelForSeq2SeqLM.from_pretrained(output_dir / backbone)
        record.update(
            full_is_sharded=bool(fsdp_modules(full)),
            trained_moved=all(not torch.equal(initial[name], trained[name])
                              for name, parameter in reference.named_parameters() if parameter.requires_grad),
            unlike_one_process=[name for name in trained
                                if not torch.allclose(reference.state_dict()[name], trained[name], atol=1e-5)],
            full_equals_trained=all(torch.equal(full.state_dict()[name], trained[name]) for name in trained),
            reloaded_class=type(reloaded).__name__,
            reloaded_equals_trained=all(torch.equal(reloaded.state_dict()[name], trained[name]) for name in trained),
            reloaded_translates_alike=torch.equal(reloaded.generate(**inputs, max_length=8, num_beams=2),
                                                  translations),
        )
    dist.barrier()
    return record


def fsdp2_process(rank: int, world_size: int, port: int, output_dir: Path, backbones: list[str]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        records = {backbone: fsdp2_run(backbone, output_dir, rank) for backbone in backbones}
    finally:
        dist.destroy_process_group()
    (output_dir / f"rank{rank}.json").write_text(json.dumps(records))


@pytest.mark.skipif(fsdp2_prepare_model is None, reason="this accelerate has no FSDP2 (it came after 1.3)")
def test_fsdp2_processes_train_then_gather_translate_save_and_reload(tmp_path):
    """Two processes (gloo on CPU, forked from this one) shard a PR model of each backbone with FSDP2 by the policy
    of `fsdp.yaml`, train 3 steps, and end as the recipe ends a run: the main process's full model holds what the
    shards trained, is not sharded, translates and saves alone, and the saved folder loads with those weights and
    translations; every process exits."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backbones = ["marian", "t5"]
    processes = torch.multiprocessing.start_processes(fsdp2_process, args=(2, port, tmp_path, backbones), nprocs=2,
                                                      join=False, start_method="fork")
    deadline = time.monotonic() + 180
    while not processes.join(timeout=max(deadline - time.monotonic(), 0)):  # returns as each process ends
        if time.monotonic() >= deadline:
            for process in processes.processes:
                process.kill()
            pytest.fail("the FSDP2 processes did not finish within 180 s")
    main, other = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    for backbone in backbones:
        run, other_run = main[backbone], other[backbone]
        assert run["wrapped"] == other_run["wrapped"]
        assert set(layers(tiny_model(backbone, "phrase_representation"))) < set(run["wrapped"]), run["wrapped"]
        assert other_run["own_model_back"] and not run["own_model_back"]
        assert run["trained_moved"] and run["unlike_one_process"] == [], run  # T5's position bias table included
        assert not run["full_is_sharded"] and run["full_equals_trained"], run
        assert run["reloaded_equals_trained"] and run["reloaded_translates_alike"], run
        assert run["reloaded_class"] == type(tiny_model(backbone, "transformer")).__name__


@pytest.mark.parametrize("encoder_type", ENCODER_TYPES)
@pytest.mark.parametrize("backbone", ["marian", "t5"])
def test_every_parameter_trains_so_ddp_searches_for_none(multi30k_processor, multi30k_val, backbone, encoder_type):
    """A training step gives every parameter of every encoder type a gradient (what DDP's `find_unused_parameters`
    would search the graph for after each forward), so the recipe turns the search off; LayerDrop, which skips
    layers, turns it on, and the `training` section's own value wins."""
    torch.manual_seed(0)
    tokenizer = multi30k_processor.tokenizer
    vocabulary = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      num_phrase_tags=len(multi30k_processor.phrase_tags))
    model = tiny_model(backbone, encoder_type, **vocabulary)
    sources, targets = multi30k_val
    batch = multi30k_processor(sources[:4], text_target=targets[:4], return_tensors="pt", padding=True)
    model(**batch).loss.backward()
    # DDP reduces the gradients of the parameters that train (Marian's sinusoidal positions do not)
    assert [name for name, parameter in model.named_parameters()
            if parameter.requires_grad and parameter.grad is None] == []
    assert ddp_find_unused_parameters(model, {}) is False
    assert ddp_find_unused_parameters(model, {"ddp_find_unused_parameters": True}) is True
    if backbone == "marian":
        layerdrop = tiny_model(backbone, encoder_type, encoder_layerdrop=0.1, **vocabulary)
        assert ddp_find_unused_parameters(layerdrop, {}) is True
