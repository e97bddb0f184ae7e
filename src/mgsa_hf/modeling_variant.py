"""The type every encoder variant is: [`Variant`], what one variant adds, read by the configuration, both backbones and
the outputs (each `variant_*.py` module defines one; `variants.py` registers them)."""

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache

import torch

from .modeling_attention import MgsaAttention
from .modeling_syntax_inputs import MgsaSyntaxInputs


def reads_no_syntax(config) -> tuple[str, ...]:
    """[`Variant.syntax_fields`] of a variant whose logits read no source syntax: none."""
    return ()


def compiles_always(config) -> bool:
    """[`Variant.compiles_fullgraph`] of a variant that always runs under `torch.compile(fullgraph=True)`."""
    return True


@dataclass(frozen=True, eq=False)
class Variant:
    """
    One encoder variant (a value of `config.encoder_type`): everything the configuration, both backbones and the
    outputs read about it. Each variant module defines one; `variants.py` registers them, and a new method is a new
    module with its `Variant` plus a line there (see docs/adding-a-variant.md).

    Attributes:
        name (`str`): the `encoder_type` value.
        summary (`str`), paper (`str`), paper_url (`str`): what it computes, in a phrase, and the title of its paper
            and its address (ACL Anthology or arXiv), for model cards.
        config_fields (`type`, *optional*):
            A `dataclass(kw_only=True)` mixin of [`~mgsa_hf.configuration_mgsa.MgsaVariantConfig`]: the variant's
            fields with their types, defaults and validators (`configuration_fields.py`), `validate_*` methods that
            relate them, and their documentation (its docstring's `Args:` entries, joined into the config's).
        field_prefixes (`tuple[str, ...]`):
            Prefixes of its field names: an unknown keyword argument with one of them is taken for a misspelt field.
        layers_field (`str`, *optional*):
            The field listing the encoder layers whose self-attention the variant replaces by `self_attention`;
            `default_layers` is its default (the layers the encoder has).
        none_defaults (`Mapping[str, object]`):
            The values of its fields given as None whose default is a list (a dataclass default cannot be one).
        self_attention (`type`, *optional*):
            The [`MgsaAttention`] subclass of those layers. It reads the variant's `inputs` as `syntax` and returns
            `(output, weights, MgsaLayerOutput)`.
        encoder_layer_mixin, decoder_layer_mixin (`type`, *optional*):
            Mixins put before each backbone's encoder / decoder layer class on every layer (PR's phrase sub-layers):
            they use the backbone's `sublayer`, `make_layer_norm` and `make_output_layer_norm`.
        inputs (`type`, *optional*):
            What its layers read, made once per forward as `inputs.from_syntax(config, syntax, hidden_states)` from
            the [`MgsaSyntaxInputs`] and the embedded source (B, L, D); without one the layers read the syntax itself.
        syntax_fields (`Callable[[config], tuple[str, ...]]`):
            The source syntax fields a model of `config` reads to compute its logits (the graph inputs of an export);
            MG-SA's `phrase_tags` feed only its loss.
        output_fields (`tuple[str, ...]`):
            The [`MgsaLayerOutput`] fields its layers fill.
        legacy_values (`Mapping[str, object]`):
            For fields added after models were saved: the value a saved config without the field gets, the function
            it was trained with (a callable takes the saved dict).
        compiles_fullgraph (`Callable[[config], bool]`):
            Whether a model of `config` runs under `torch.compile(fullgraph=True)`.
    """

    name: str
    summary: str = ""
    paper: str = ""
    paper_url: str = ""
    config_fields: type | None = None
    field_prefixes: tuple[str, ...] = ()
    layers_field: str | None = None
    default_layers: tuple[int, ...] = ()
    none_defaults: Mapping = field(default_factory=dict)
    self_attention: type | None = None
    encoder_layer_mixin: type | None = None
    decoder_layer_mixin: type | None = None
    inputs: type | None = None
    syntax_fields: Callable = reads_no_syntax
    output_fields: tuple[str, ...] = ()
    legacy_values: Mapping = field(default_factory=dict)
    compiles_fullgraph: Callable = compiles_always

    def layers(self, config) -> list[int]:
        """The encoder layers whose self-attention the variant replaces (none for a variant of whole layers)."""
        return list(getattr(config, self.layers_field)) if self.layers_field else []

    def layer_inputs(self, config, syntax: "MgsaSyntaxInputs", hidden_states: torch.Tensor):
        """What the variant's layers read in this forward: its `inputs` made from `syntax`, or `syntax` itself."""
        return syntax if self.inputs is None else self.inputs.from_syntax(config, syntax, hidden_states)

    def encoder_self_attention(self, config, layer_idx: int, **kwargs) -> "MgsaAttention":
        """The self-attention of encoder layer `layer_idx`: the variant's on its layers, plain otherwise (either
        backbone; `kwargs` go to the attention, e.g. T5's `has_relative_attention_bias`)."""
        attention_class = self.self_attention if layer_idx in self.layers(config) else MgsaAttention
        return attention_class(config, config.encoder_attention_heads, layer_idx=layer_idx, **kwargs)

    def encoder_layer_class(self, base: type) -> type:
        """A backbone's encoder layer class `base`, with the variant's mixin when it has one."""
        return with_mixin(self.encoder_layer_mixin, base)

    def decoder_layer_class(self, base: type) -> type:
        """A backbone's decoder layer class `base`, with the variant's mixin when it has one."""
        return with_mixin(self.decoder_layer_mixin, base)


@cache
def with_mixin(mixin: type | None, base: type) -> type:
    """`base`, or one class `<Mixin><Base>` of `mixin` before `base` (made once per pair)."""
    if mixin is None:
        return base
    name = mixin.__name__.removesuffix("Mixin").removesuffix("Encoder").removesuffix("Decoder")
    name += base.__name__.removeprefix("Mgsa")  # PhraseRepresentationEncoderLayer, PhraseRepresentationT5EncoderBlock
    layer_class = type(name, (mixin, base), {"__module__": base.__module__, "__doc__": mixin.__doc__})
    setattr(sys.modules[base.__module__], name, layer_class)  # found by name, as pickle looks for it
    return layer_class
