"""mgsa-hf: phrase- and syntax-aware self-attention for neural machine translation in Hugging Face Transformers.

Importing the package registers the `mgsa` model type with the Auto classes (config, model, processor) and the
`translation` pipeline task.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_mgsa import MgsaConfig
from .data_collator import MgsaDataCollator
from .modeling_mgsa import MgsaForConditionalGeneration, MgsaModel, MgsaPreTrainedModel
from .pipeline_translation import MgsaTranslationPipeline, register_translation_pipeline
from .processing_mgsa import MgsaProcessor


AutoConfig.register(MgsaConfig.model_type, MgsaConfig, exist_ok=True)
AutoModel.register(MgsaConfig, MgsaModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(MgsaConfig, MgsaForConditionalGeneration, exist_ok=True)
# `save_pretrained` then writes `auto_map` and the code files, so `trust_remote_code=True` loads a saved folder
# where this package is not installed.
MgsaConfig.register_for_auto_class()
MgsaForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
MgsaProcessor.register_for_auto_class()
register_translation_pipeline()

__version__ = "0.1.0"

__all__ = [
    "MgsaConfig",
    "MgsaDataCollator",
    "MgsaForConditionalGeneration",
    "MgsaModel",
    "MgsaPreTrainedModel",
    "MgsaProcessor",
    "MgsaTranslationPipeline",
]
