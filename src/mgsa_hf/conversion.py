"""Upgrade a Marian (opus-mt style) or T5 checkpoint to an MGSA model folder."""

from transformers import PretrainedConfig

from .configuration_mgsa import MgsaConfig, MgsaT5Config
from .modeling_mgsa import MgsaForConditionalGeneration
from .modeling_mgsa_t5 import MgsaT5ForConditionalGeneration


# backbone -> (configuration, model) classes; a checkpoint's model_type (its own or ours) picks the backbone
BACKBONES = {
    "marian": (MgsaConfig, MgsaForConditionalGeneration),
    "t5": (MgsaT5Config, MgsaT5ForConditionalGeneration),
}


def checkpoint_backbone(path: str) -> str:
    """"marian" or "t5" for a Marian/MGSA or a T5/MGSA-T5 checkpoint (folder or Hub id)."""
    model_type = PretrainedConfig.get_config_dict(path)[0].get("model_type")
    for backbone, (config_class, _) in BACKBONES.items():
        if model_type in (config_class.model_type, config_class.source_model_type):
            return backbone
    raise ValueError(
        f"{path} holds a {model_type!r} model; MGSA models start from Marian (opus-mt) or T5 checkpoints."
    )


def new_module_names(missing_keys: list[str]) -> list[str]:
    """Collapse freshly initialised parameter names to the modules that own them, e.g.
    `model.encoder.layers.0.self_attn.gate.weight` → `model.encoder.layers.0.self_attn.gate`."""
    return sorted({key.rsplit(".", 1)[0] for key in missing_keys})


def load_as_mgsa(path: str, encoder_type: str = "transformer", **config_overrides):
    """
    Load a Marian or T5 (or MGSA) checkpoint, folder or Hub id, as [`MgsaForConditionalGeneration`] or
    [`MgsaT5ForConditionalGeneration`] with the given encoder.

    Returns:
        `(model, new_modules)`: the model, and the names of the modules the checkpoint did not have (the variant's),
        which were freshly initialised. Raises `ValueError` if the checkpoint has weights the model cannot take.
    """
    backbone = checkpoint_backbone(path)
    config_class, model_class = BACKBONES[backbone]
    config = config_class.from_pretrained(path, encoder_type=encoder_type, **config_overrides)
    model, info = model_class.from_pretrained(path, config=config, output_loading_info=True)
    if info["unexpected_keys"] or info["mismatched_keys"]:
        raise ValueError(
            f"{path} is not a {backbone} checkpoint this model can take: unexpected {info['unexpected_keys']}, "
            f"mismatched {info['mismatched_keys']}."
        )
    return model, new_module_names(info["missing_keys"])


def convert_checkpoint(path: str, output_dir: str, encoder_type: str = "transformer", **overrides):
    """Write `output_dir` with the MGSA model and, when the source has a tokenizer, an [`MgsaProcessor`] around it
    (tokenizer + default parser); return a report."""
    from transformers import AutoTokenizer

    from .processing_mgsa import MgsaProcessor

    model, new_modules = load_as_mgsa(path, encoder_type, **overrides)
    model.save_pretrained(output_dir)  # with the model's code, the translation pipeline's included
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError):  # the source has no tokenizer files
        tokenizer = None
    if tokenizer is not None:
        MgsaProcessor(tokenizer).save_pretrained(output_dir)
    return {
        "source": str(path),
        "output_dir": str(output_dir),
        "encoder_type": encoder_type,
        "parameters": model.num_parameters(),
        "new_modules": new_modules,
        "processor_saved": tokenizer is not None,
    }
