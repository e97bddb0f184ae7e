"""Checks of a model's weights themselves, at load and at `generate`.

* Fixed position tables stay fixed. Marian's sinusoidal position embeddings are built, not learnt: a fresh model
  makes them with `requires_grad=False` and `save_pretrained` leaves them out, rebuilding them at load. Transformers
  hands loaded (or rebuilt) weights back as trainable parameters, so a fine-tuned model's optimizer trained them, and
  its saved folder, reloaded with the sinusoids, translated otherwise than the model that was scored.
  [`freeze_position_tables`] gives a loaded model the fresh model's setting.
* Weights that are not numbers are named. One NaN or inf in a weight makes every output NaN (translations come out
  empty) without an error anywhere: [`warn_non_finite_weights`] names the tensors that hold one.
"""

import torch
from torch import nn
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
from transformers.utils import logging


logger = logging.get_logger(__name__)


def freeze_position_tables(model: nn.Module) -> None:
    """Mark `model`'s sinusoidal position tables as not trainable, as a freshly built model has them: no optimizer
    changes them, so the table a saved model is rebuilt with is the one it was trained and scored with."""
    for module in model.modules():
        if isinstance(module, MarianSinusoidalPositionalEmbedding):
            module.weight.requires_grad_(False)


@torch.no_grad()
def non_finite_weights(model: nn.Module) -> list[str]:
    """
    The names of `model`'s floating-point parameters and buffers that hold a NaN or an infinite value (tensors
    without data, on the meta device, are skipped). A tensor's float32 sum is non-finite when it holds one (NaN and inf
    carry through a sum); only those tensors are then read element by element (a sum can also overflow): one pass
    over the weights and one reading back per device, about 25 ms for a 75M-parameter model on one CPU thread (350 ms
    element by element).
    """
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and tensor.device.type != "meta" and tensor.numel():
            by_device.setdefault(tensor.device, []).append((name, tensor))
    names = []
    for tensors in by_device.values():
        finite_sums = torch.stack([tensor.sum(dtype=torch.float32) for _, tensor in tensors]).isfinite().tolist()
        names += [name for (name, tensor), finite in zip(tensors, finite_sums, strict=True)
                  if not finite and not bool(tensor.isfinite().all())]
    return names


def weights_version(model: nn.Module) -> int:
    """The sum of the version counters of `model`'s parameters, which every in-place change (an optimizer step, a
    load) raises: the same number means the same weights."""
    return sum(tensor._version for tensor in model.parameters())


def warn_non_finite_weights(model: nn.Module, when: str) -> list[str]:
    """Log a warning naming `model`'s weights that hold NaN or inf ([`non_finite_weights`]), found `when` (e.g.
    "loading ./model"); once per model and set of names. The weights are read again only when they changed since
    the last check ([`weights_version`]). Returns the names."""
    version = weights_version(model)
    checked = getattr(model, "_non_finite_weights_checked", None)
    names = checked[1] if checked is not None and checked[0] == version else non_finite_weights(model)
    model._non_finite_weights_checked = (version, names)
    if names:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        logger.warning_once(
            f"{when}: {len(names)} weight tensor(s) of the {type(model).__name__} hold NaN or inf values ({shown}): "
            "every output of the model is undefined (translations come out empty). They come from a training step "
            "that diverged or from a damaged file: load an earlier checkpoint."
        )
    return names


class CheckedWeightsMixin:
    """Placed before `PreTrainedModel` in a model's bases: `from_pretrained` keeps the sinusoidal position tables fixed
    ([`freeze_position_tables`]) and warns of weights holding NaN or inf ([`warn_non_finite_weights`])."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        freeze_position_tables(model)
        warn_non_finite_weights(model, f"loading {args[0] if args else kwargs.get('pretrained_model_name_or_path')}")
        return loaded
