"""Upgrade a Marian (opus-mt style) checkpoint to an MGSA model folder."""

from .configuration_mgsa import MgsaConfig
from .modeling_mgsa import MgsaForConditionalGeneration


def new_module_names(missing_keys: list[str]) -> list[str]:
    """Collapse freshly initialised parameter names to the modules that own them, e.g.
    `model.encoder.layers.0.self_attn.gate.weight` → `model.encoder.layers.0.self_attn.gate`."""
    return sorted({key.rsplit(".", 1)[0] for key in missing_keys})


def load_marian_as_mgsa(marian_path: str, encoder_type: str = "transformer", **config_overrides):
    """
    Load a Marian (or MGSA) checkpoint, folder or Hub id, as [`MgsaForConditionalGeneration`] with the given encoder.

    Returns:
        `(model, new_modules)`: the model, and the names of the modules the checkpoint did not have (the variant's),
        which were freshly initialised. Raises `ValueError` if the checkpoint has weights the model cannot take.
    """
    config = MgsaConfig.from_pretrained(marian_path, encoder_type=encoder_type, **config_overrides)
    model, info = MgsaForConditionalGeneration.from_pretrained(marian_path, config=config, output_loading_info=True)
    if info["unexpected_keys"] or info["mismatched_keys"]:
        raise ValueError(
            f"{marian_path} is not a Marian checkpoint this model can take: unexpected {info['unexpected_keys']}, "
            f"mismatched {info['mismatched_keys']}."
        )
    return model, new_module_names(info["missing_keys"])


def convert_marian_checkpoint(marian_path: str, output_dir: str, encoder_type: str = "transformer", **overrides):
    """Write `output_dir` with the MGSA model and, when the source has a tokenizer, an [`MgsaProcessor`] around it
    (tokenizer + default parser); return a report."""
    from transformers import AutoTokenizer

    from .pipeline_translation import add_remote_pipeline
    from .processing_mgsa import MgsaProcessor

    model, new_modules = load_marian_as_mgsa(marian_path, encoder_type, **overrides)
    add_remote_pipeline(model, output_dir)
    model.save_pretrained(output_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(marian_path)
    except (OSError, ValueError, TypeError):  # the source has no tokenizer files
        tokenizer = None
    if tokenizer is not None:
        MgsaProcessor(tokenizer).save_pretrained(output_dir)
    return {
        "source": str(marian_path),
        "output_dir": str(output_dir),
        "encoder_type": encoder_type,
        "parameters": model.num_parameters(),
        "new_modules": new_modules,
        "processor_saved": tokenizer is not None,
    }
