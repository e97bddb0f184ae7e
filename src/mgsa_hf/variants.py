"""The registry of encoder variants: `encoder_type` → its [`~mgsa_hf.modeling_variant.Variant`].

Each variant is one module (`variant_<name>.py`) that defines its configuration fields, its layers and its `Variant`;
the configuration, both backbones and the outputs read them from here. Adding a method is a new module and its line
below (docs/adding-a-variant.md says what the module holds).
"""

from .encoder_types import ENCODER_TYPES
from .modeling_variant import Variant
from .variant_hybrid import HYBRID
from .variant_phrase_memory import PHRASE_MEMORY
from .variant_phrase_representation import PHRASE_REPRESENTATION
from .variant_rhe import RHE


# the plain Transformer: Marian's (T5's) own layers, no fields, no syntax
TRANSFORMER = Variant(name="transformer", summary="the plain Transformer.", paper="Attention Is All You Need",
                      paper_url="https://arxiv.org/abs/1706.03762")

VARIANTS: dict[str, Variant] = {
    variant.name: variant for variant in (TRANSFORMER, PHRASE_MEMORY, PHRASE_REPRESENTATION, HYBRID, RHE)
}
if tuple(VARIANTS) != ENCODER_TYPES:
    raise ImportError(f"encoder_types.ENCODER_TYPES {ENCODER_TYPES} must name the variants {tuple(VARIANTS)}.")
