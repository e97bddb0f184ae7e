"""mgsa-hf: phrase- and syntax-aware self-attention for neural machine translation in Hugging Face Transformers.

Importing the package registers the `mgsa` (Marian backbone) and `mgsa_t5` (T5 backbone) model types with the Auto
classes (config, model, processor) and the `translation` pipeline task, so that a saved folder loads with
`AutoModelForSeq2SeqLM` and `pipeline`. It does so without importing transformers (and torch) itself, so that
`mgsa-hf --help` answers at once, and the classes below are imported when first used. Registration happens as soon as
transformers is there:

- at once, when transformers was imported before `mgsa_hf`;
- otherwise right after the import that brings transformers in has finished. Registering imports the package's model
  modules, and the one whose import brought transformers in is not complete until then, so the registration waits
  until no module of this package is still being imported.
"""

import importlib
import importlib.abc
import sys


__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "MgsaConfig": ".configuration_mgsa",
    "MgsaT5Config": ".configuration_mgsa",
    "MgsaDataCollator": ".data_collator",
    "MgsaForConditionalGeneration": ".modeling_mgsa",
    "MgsaModel": ".modeling_mgsa",
    "MgsaPreTrainedModel": ".modeling_mgsa",
    "MgsaT5ForConditionalGeneration": ".modeling_mgsa_t5",
    "MgsaT5Model": ".modeling_mgsa_t5",
    "MgsaT5PreTrainedModel": ".modeling_mgsa_t5",
    "MgsaTranslationPipeline": ".pipeline_translation",
    "MgsaProcessor": ".processing_mgsa",
    # the Trainer (and with it accelerate)
    "MgsaSeq2SeqTrainer": ".training.trainer",
}

def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)

_REGISTERED = False
# how many of this package's modules (and transformers) are being imported right now, one inside the other
_IMPORTS_UNDER_WAY = 0


def register_auto_classes() -> None:
    """Register both model types with `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM`, the processor with
    `AutoProcessor` and the translation pipeline; the later calls do nothing."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    try:
        from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

        from .configuration_mgsa import MgsaConfig, MgsaT5Config
        from .modeling_mgsa import MgsaForConditionalGeneration, MgsaModel
        from .modeling_mgsa_t5 import MgsaT5ForConditionalGeneration, MgsaT5Model
        from .pipeline_translation import register_translation_pipeline
        from .processing_mgsa import MgsaProcessor

        for config_class, model_class, generation_class in (
            (MgsaConfig, MgsaModel, MgsaForConditionalGeneration),
            (MgsaT5Config, MgsaT5Model, MgsaT5ForConditionalGeneration),
        ):
            AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
            AutoModel.register(config_class, model_class, exist_ok=True)
            AutoModelForSeq2SeqLM.register(config_class, generation_class, exist_ok=True)
            # `save_pretrained` then writes `auto_map` and the code files, so `trust_remote_code=True` loads a saved
            # folder where this package is not installed.
            config_class.register_for_auto_class()
            generation_class.register_for_auto_class("AutoModelForSeq2SeqLM")
        MgsaProcessor.register_for_auto_class()
        register_translation_pipeline()
        sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _RegisterAfterImport)]
    except BaseException:
        _REGISTERED = False
        raise


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the loading of transformers and of this package's modules, and registers once
    the outermost of them has finished while transformers is imported."""

    def find_spec(self, name, path, target=None):
        if _REGISTERED or not (name == "transformers" or name.startswith(__name__ + ".")):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader.exec_module = _then_register(spec.loader.exec_module)
        return spec


def _then_register(exec_module):
    def exec_module_then_register(module):
        global _IMPORTS_UNDER_WAY
        _IMPORTS_UNDER_WAY += 1
        try:
            exec_module(module)
        finally:
            _IMPORTS_UNDER_WAY -= 1
        if _IMPORTS_UNDER_WAY == 0 and "transformers" in sys.modules:
            register_auto_classes()

    return exec_module_then_register


def register_when_transformers_is_imported() -> None:
    """What `import mgsa_hf` does: register now if transformers is imported, otherwise as soon as it is."""
    if "transformers" in sys.modules:
        register_auto_classes()
    elif not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())


register_when_transformers_is_imported()
