"""The upgrade of a checkpoint that lacks the variant's modules (a Marian or T5 checkpoint, or an MGSA one of another
`encoder_type`): [`VariantUpgradeMixin.from_pretrained`] starts the new modules so that the model computes what the
checkpoint computed, as far as the variant allows."""

import torch
from transformers.utils import logging


logger = logging.get_logger(__name__)


NEW_MODULE_INITS = ("identity", "random")


def new_module_names(missing_keys: list[str]) -> list[str]:
    """Collapse freshly initialised parameter names to the modules that own them, e.g.
    `model.encoder.layers.0.self_attn.gate.weight` → `model.encoder.layers.0.self_attn.gate`."""
    return sorted({key.rsplit(".", 1)[0] for key in missing_keys})


@torch.no_grad()
def init_new_modules_as_identity(model, new_modules: list[str]) -> bool:
    """
    Start the variant's freshly initialised modules so that the upgraded model computes what its source checkpoint
    computed, as far as the variant allows (each module's `init_as_identity` says how):

    - `hybrid`: the gate of Eq. 5 at σ(−8) ≈ 3.4e-4 on every token (`"concat"`: exactly the global pattern);
    - `rhe` (LPEA, out-of-phrase pairs clipped): SEA's bias P at about 1e-4, so redundant heads attend as before;
    - `phrase_representation`: the attentive combination's output at 0, exact on T5 (pre-norm); on Marian each
      added sub-layer still ends in a LayerNorm of its own;
    - `phrase_memory`: no setting — its phrase heads attend over composed phrases instead of tokens;
    - DEA, masked out-of-phrase pairs, RHE-prune and hybrid `"local"` change the attention by construction.

    Args:
        new_modules: the names of the modules the checkpoint did not have; only these are touched.

    Returns:
        Whether the model now computes exactly what the source computed (every new module starts as an identity).
    """

    def inside(new: str, name: str) -> bool:
        return new == name or new.startswith(f"{name}.")

    exact, touched = True, []
    for name, module in model.named_modules():  # parents first: a module inside a started one was started by it
        if any(inside(name, parent) for parent in touched):
            continue
        if hasattr(module, "init_as_identity") and any(inside(new, name) for new in new_modules):
            exact &= module.init_as_identity()
            touched.append(name)
    untouched = [new for new in new_modules if not any(inside(new, name) for name in touched)]
    return exact and not untouched


class VariantUpgradeMixin:
    """
    `from_pretrained` of the MGSA models: a checkpoint without the variant's modules (a Marian or T5 checkpoint, or an
    MGSA one of another `encoder_type`) is upgraded so that the model computes what the checkpoint computed, as far
    as the variant allows ([`init_new_modules_as_identity`]); `new_modules_init="random"` keeps the variant's own
    initialisation. A checkpoint with every weight loads as saved.
    """

    @classmethod
    def from_pretrained(cls, *args, new_modules_init: str = "identity", **kwargs):
        if new_modules_init not in NEW_MODULE_INITS:
            raise ValueError(f"new_modules_init must be one of {NEW_MODULE_INITS}, got {new_modules_init!r}.")
        return_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        earlier_concat = sorted(key for key in info["unexpected_keys"] if ".concat_proj." in key)
        if earlier_concat:
            raise ValueError(
                f"{args[0] if args else 'The checkpoint'} holds a hybrid \"concat\" layer in its earlier layout, a "
                f"separate `concat_proj` before the output projection ({earlier_concat[0]}, ...), which the current "
                "layer (the output projection reads [global ; local] directly) cannot load without changing the "
                "model's function. Load it with the mgsa-hf version that saved it."
            )
        new_modules = new_module_names(info["missing_keys"])
        if new_modules and new_modules_init == "identity":
            exact = init_new_modules_as_identity(model, new_modules)
            logger.info("encoder_type=%r: the new modules %s start %s", model.config.encoder_type,
                        ", ".join(new_modules),
                        "as an identity" if exact else "close to the checkpoint's function, where the variant allows")
        return (model, info) if return_info else model
