"""mgsa-hf: phrase- and syntax-aware self-attention for neural machine translation in Hugging Face Transformers.

Importing the package registers the `mgsa` model type with the Auto classes.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_mgsa import MgsaConfig
from .modeling_mgsa import MgsaForConditionalGeneration, MgsaModel, MgsaPreTrainedModel


AutoConfig.register(MgsaConfig.model_type, MgsaConfig, exist_ok=True)
AutoModel.register(MgsaConfig, MgsaModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(MgsaConfig, MgsaForConditionalGeneration, exist_ok=True)
# `save_pretrained` then writes `auto_map` and the code files, so `trust_remote_code=True` loads a saved folder
# where this package is not installed.
MgsaConfig.register_for_auto_class()
MgsaForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

__version__ = "0.1.0"

__all__ = ["MgsaConfig", "MgsaForConditionalGeneration", "MgsaModel", "MgsaPreTrainedModel"]
