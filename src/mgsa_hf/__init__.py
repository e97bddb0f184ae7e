"""mgsa-hf: phrase- and syntax-aware self-attention for neural machine translation in Hugging Face Transformers.

Importing the package registers the `mgsa` (Marian backbone) and `mgsa_t5` (T5 backbone) model types with the Auto
classes (config, model, processor) and the `translation` pipeline task.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_mgsa import MgsaConfig, MgsaT5Config
from .data_collator import MgsaDataCollator
from .modeling_mgsa import MgsaForConditionalGeneration, MgsaModel, MgsaPreTrainedModel
from .modeling_mgsa_t5 import MgsaT5ForConditionalGeneration, MgsaT5Model, MgsaT5PreTrainedModel
from .pipeline_translation import MgsaTranslationPipeline, register_translation_pipeline
from .processing_mgsa import MgsaProcessor


for config_class, model_class, generation_class in (
    (MgsaConfig, MgsaModel, MgsaForConditionalGeneration),
    (MgsaT5Config, MgsaT5Model, MgsaT5ForConditionalGeneration),
):
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    AutoModel.register(config_class, model_class, exist_ok=True)
    AutoModelForSeq2SeqLM.register(config_class, generation_class, exist_ok=True)
    # `save_pretrained` then writes `auto_map` and the code files, so `trust_remote_code=True` loads a saved folder
    # where this package is not installed.
    config_class.register_for_auto_class()
    generation_class.register_for_auto_class("AutoModelForSeq2SeqLM")
MgsaProcessor.register_for_auto_class()
register_translation_pipeline()

__version__ = "0.1.0"


def __getattr__(name: str):
    # the Trainer (and with it accelerate) is imported only when asked for
    if name == "MgsaSeq2SeqTrainer":
        from .training.trainer import MgsaSeq2SeqTrainer

        return MgsaSeq2SeqTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MgsaConfig",
    "MgsaDataCollator",
    "MgsaForConditionalGeneration",
    "MgsaModel",
    "MgsaPreTrainedModel",
    "MgsaProcessor",
    "MgsaSeq2SeqTrainer",
    "MgsaT5Config",
    "MgsaT5ForConditionalGeneration",
    "MgsaT5Model",
    "MgsaT5PreTrainedModel",
    "MgsaTranslationPipeline",
]
