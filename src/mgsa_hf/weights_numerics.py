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


def non_finite_weights(model: nn.Module) -> list[str]:
    """The names of `model`'s floating-point parameters and buffers that hold a NaN or an infinite value (one reading
    back per device; tensors without data, on the meta device, are skipped)."""
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and tensor.device.type != "meta" and tensor.numel():
            by_device.setdefault(tensor.device, []).append((name, tensor))
    names = []
    for tensors in by_device.values():
        with torch.no_grad():
            finite = torch.stack([tensor.isfinite().all() for _, tensor in tensors]).tolist()
        names += [name for (name, _), ok in zip(tensors, finite, strict=True) if not ok]
    return names


def warn_non_finite_weights(model: nn.Module, when: str) -> list[str]:
    """Log a warning naming `model`'s weights that hold NaN or inf ([`non_finite_weights`]), found `when` (e.g.
    "loading ./model"); once per model and set of names. Returns the names."""
    names = non_finite_weights(model)
    if names:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        logger.warning_once(
            f"{when}: {len(names)} weight tensor(s) of the {type(model).__name__} hold NaN or inf values ({shown}): "
            "every output of the model is undefined (translations come out empty). The weights were saved after a "
            "training step that diverged or the file is damaged: load an earlier checkpoint."
        )
    return names


def warn_non_finite_weights_once(model: nn.Module, when: str) -> None:
    """[`warn_non_finite_weights`] when `model`'s weights changed since its last check here (the sum of their
    version counters, which every in-place change such as an optimizer step or a load raises): `generate` checks
    them without reading every weight at every call."""
    version = sum(tensor._version for tensor in model.parameters())
    if getattr(model, "_weights_checked_at_version", None) != version:
        warn_non_finite_weights(model, when)
        model._weights_checked_at_version = version


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
