"""What the training recipe does differently when its processes shard the model (FSDP) or train it side by side
(DDP): the full model the main process scores and saves at the end of a run, and DDP's search for unused parameters.

Under FSDP each process holds a shard of every parameter (FSDP2's `fully_shard` turns them into `DTensor`s), so a
model that one process calls alone either fails ("mixed torch.Tensor and DTensor" in `generate`) or waits forever
for the others (gathering its weights in `save_pretrained`). At the end of a run every process therefore takes part
in gathering the full state dict, and the main process loads it into a plain model of the same class, which it
scores and saves exactly as the model of a single process ([`model_for_main_process`]). DeepSpeed ZeRO stage 3, which
shards the parameters too, is not handled: the recipe takes ZeRO stages 1 and 2
(`mgsa-hf accelerate-config deepspeed_zero2`).

Before training, every process compares what it prepared (tokenizer, processor, processed splits) with global rank
0's and the run stops, naming the machine, where they differ ([`check_same_inputs`]): machines that prepare apart must
train on one vocabulary and one corpus, which DDP does not check (it averages the gradients of any two embeddings of
the same shape).
"""

import copy
import hashlib
import json
import socket

import torch


def fsdp_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules of `model` (itself included) that FSDP shards: FSDP2's `fully_shard` modules and FSDP1's
    `FullyShardedDataParallel` wrappers. Empty for a model of one process, DDP or DeepSpeed."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    kinds = (FullyShardedDataParallel,)
    try:
        from torch.distributed.fsdp import FSDPModule  # torch >= 2.6

        kinds += (FSDPModule,)
    except ImportError:
        pass
    return [module for module in model.modules() if isinstance(module, kinds)]


def _without_fsdp1_wrapper(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside FSDP1's `FullyShardedDataParallel` wrapper (FSDP2 shards the model in place)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    while isinstance(model, FullyShardedDataParallel):
        model = model.module
    return model


def unsharded_class(model: torch.nn.Module) -> type:
    """The model's own class: FSDP2 gives a sharded module a class of its own, `FSDP<Class>`, made from `FSDPModule`
    and the module's class; FSDP1 wraps the model in `FullyShardedDataParallel`."""
    model = _without_fsdp1_wrapper(model)
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return type(model)
    return next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """
    The full (unsharded) state dict of an FSDP model, on CPU, on the main process (rank 0); the other processes get
    an empty dict. Every process must call it: each sends its shards (`torch.distributed.checkpoint`'s
    `get_model_state_dict`, for FSDP1 and FSDP2 alike).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def model_for_main_process(model: torch.nn.Module, device: torch.device | str | None = None):
    """
    The trained model as the main process scores and saves it. Every process must call it.

    Args:
        model (`PreTrainedModel`): the trained model (`trainer.model`), sharded by FSDP or not.
        device (`torch.device`, *optional*): where the main process's full copy goes (the training device; default
            the CPU).

    Returns:
        `model` itself when it is not sharded (one process, DDP, DeepSpeed ZeRO-1/2: every process holds all of
        it). Under FSDP: on the main process a new model of the same class, configuration, generation config and
        dtype holding the gathered full state dict, in eval mode, a plain model that `generate` and
        `save_pretrained` take alone; `model` itself, sharded, on the other processes.
    """
    if not fsdp_modules(model):
        return model
    state = full_state_dict(model)  # a collective: every process sends its shards
    if torch.distributed.get_rank() != 0:
        return model
    unwrapped = _without_fsdp1_wrapper(model)
    full = unsharded_class(unwrapped)(copy.deepcopy(unwrapped.config))
    full.generation_config = copy.deepcopy(unwrapped.generation_config)
    full.load_state_dict(state)
    return full.to(device or "cpu", dtype=unwrapped.dtype).eval()


def ddp_find_unused_parameters(model: torch.nn.Module, training: dict) -> bool:
    """
    DDP's `find_unused_parameters` for training `model`: the `training` section's `ddp_find_unused_parameters`
    when it sets one; else True only where a step can leave parameters out, LayerDrop (`encoder_layerdrop`,
    `decoder_layerdrop` of the Marian backbone) skipping whole layers at random. Every encoder type, on either
    backbone and in each of its modes, gives every parameter a gradient in every step (MG-SA's tag classifier
    through its loss, RHE's syntax-enhanced attention even where every head keeps the plain one), so DDP need not
    walk the autograd graph after each forward to find the parameters left out (the Trainer's default whenever
    gradient checkpointing is off).
    """
    if training.get("ddp_find_unused_parameters") is not None:
        return bool(training["ddp_find_unused_parameters"])
    return any(getattr(model.config, name, 0) for name in ("encoder_layerdrop", "decoder_layerdrop"))


__all__ = ["ddp_find_unused_parameters", "fsdp_modules", "full_state_dict", "model_for_main_process",
           "unsharded_class"]


# rows of each processed split whose fields go into its fingerprint (evenly spaced, the first and last included)
FINGERPRINT_ROWS = 64


def inputs_fingerprint(processor, processed) -> dict[str, str]:
    """What every process of a run must share: the tokenizer's and the processor's fingerprints (the vocabulary and
    special tokens; the settings, the parser and its version, the processing code), and per processed split a hash of
    its row count and of every field of `FINGERPRINT_ROWS` rows spread over it."""
    fingerprint = {"tokenizer": processor._tokenizer_fingerprint(), "processor": processor._fingerprint()}
    for split, dataset in processed.items():
        rows = len(dataset)
        spread = (rows - 1) / (FINGERPRINT_ROWS - 1)
        picks = sorted({round(i * spread) for i in range(FINGERPRINT_ROWS)}) if rows else []
        sample = dataset.select(picks).to_dict() if picks else {}
        text = json.dumps([rows, sample], sort_keys=True, default=str)
        fingerprint[f"the processed {split} split"] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return fingerprint


def check_same_inputs(fingerprint: dict[str, str]) -> None:
    """Every process of the run (the default process group) sends `fingerprint` ([`inputs_fingerprint`]) to every
    other; where one differs from global rank 0's, every process raises the same error, naming each differing rank,
    its machine and what differs. Nothing to do in a single process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    mine = {"rank": dist.get_rank(), "host": socket.gethostname(), "fingerprint": fingerprint}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    reference = everyone[0]
    differences = []
    for entry in everyone[1:]:
        keys = sorted(key for key in reference["fingerprint"].keys() | entry["fingerprint"].keys()
                      if reference["fingerprint"].get(key) != entry["fingerprint"].get(key))
        if keys:
            differences.append(f"rank {entry['rank']} on {entry['host']}: {', '.join(keys)}")
    if differences:
        raise ValueError(
            f"the processes of this run did not prepare the same inputs as rank 0 on {reference['host']} "
            f"({'; '.join(differences)}): each machine trains on its own copy of the data or the tokenizer. Prepare "
            "once on a folder every machine reads (`prepared_dir`), or give every machine the same data, package "
            "versions and recipe (then `mgsa-hf prepare` on each)."
        )
