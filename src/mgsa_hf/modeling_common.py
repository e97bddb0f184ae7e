"""What both backbones (`modeling_mgsa.py`, Marian; `modeling_mgsa_t5.py`, T5) and every encoder variant share.

* [`Variant`]: what one encoder variant adds, read by the configuration, both backbones and the outputs (each variant
  module defines one; `variants.py` registers them).
* [`MgsaSyntaxInputs`]: the source syntax of one forward pass, packed once from the named syntax fields of a
  `forward`, and [`MgsaLayerOutput`]: what a layer contributes besides its hidden states.
* [`MgsaAttention`]: the one multi-head attention core every variant extends, with [`MgsaAttention.attend`] choosing
  the kernel.
* The model outputs, the encoder-decoder pass, the loss (label-smoothed translation loss plus MG-SA's tag loss, used
  by the models, `MgsaSeq2SeqTrainer` and the benchmark loop alike), gradient checkpointing that reaches every tensor,
  and the upgrade of a checkpoint that lacks the variant's modules.
"""

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache, partial
from pathlib import Path

import torch
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.errors import EntryNotFoundError
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, logging
from transformers.utils.generic import can_return_tuple

from .syntax_fields import SOURCE_SYNTAX_PAD_VALUES
from .target_tokens import at_least_one, per_target_token, target_token_count


logger = logging.get_logger(__name__)

# the source syntax fields a forward takes by name (`syntax_fields.py` gives their shapes and padding values)
SYNTAX_INPUT_NAMES = tuple(SOURCE_SYNTAX_PAD_VALUES)


def reads_no_syntax(config) -> tuple[str, ...]:
    return ()


def compiles_always(config) -> bool:
    return True


@dataclass(frozen=True, eq=False)
class Variant:
    """
    One encoder variant (a value of `config.encoder_type`): everything the configuration, both backbones and the
    outputs read about it. Each variant module defines one; `variants.py` registers them, and a new method is a new
    module with its `Variant` plus a line there (see the README).

    Attributes:
        name (`str`): the `encoder_type` value.
        summary (`str`), paper (`str`): what it computes, in a phrase, and the title of its paper (for model cards).
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


@dataclass
class MgsaSyntaxInputs:
    """
    The source-side inputs of one encoder forward pass, beyond the tokens themselves.

    Field names, shapes and padding values are those of `syntax_fields.py`; every tensor is batch first and aligned
    with `input_ids` (length `L`). `padding_mask` (B, L) is `True` on real tokens; the encoder sets it. A `forward`
    takes the fields by name (`Trainer` and `generate` pass inputs by the signature's names) and packs them once
    ([`pack`]); the encoder hands them to the variant, which turns the fields it reads into what its layers share
    (phrase partitions, relations) once per forward ([`Variant.layer_inputs`]).
    """

    padding_mask: torch.BoolTensor | None = None
    word_ids: torch.LongTensor | None = None
    head_word_ids: torch.LongTensor | None = None
    phrase_ids: torch.LongTensor | None = None
    phrase_tags: torch.LongTensor | None = None
    pr_phrase_ids: torch.LongTensor | None = None
    local_phrase_start: torch.LongTensor | None = None
    local_phrase_end: torch.LongTensor | None = None
    tree_depth: torch.LongTensor | None = None

    @classmethod
    def pack(cls, arguments: Mapping[str, object]) -> "MgsaSyntaxInputs":
        """The syntax fields among a forward's `arguments` (its `locals()`), by their names in `syntax_fields.py`."""
        return cls(**{name: arguments.get(name) for name in SYNTAX_INPUT_NAMES})

    def with_padding(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None) -> "MgsaSyntaxInputs":
        """These fields for a batch of source embeddings (B, L, D) with its 0/1 `attention_mask` (B, L) (None: no
        padding)."""
        if attention_mask is None:
            padding_mask = torch.ones(inputs_embeds.shape[:2], dtype=torch.bool, device=inputs_embeds.device)
        else:
            padding_mask = attention_mask.bool()
        return type(self)(padding_mask=padding_mask, **{name: getattr(self, name) for name in SYNTAX_INPUT_NAMES})

    def require(self, *names: str, needed_by: str) -> None:
        """Raise a clear error when a syntax field that `needed_by` reads was not given."""
        missing = [name for name in names if getattr(self, name) is None]
        if missing:
            raise ValueError(
                f"{needed_by} needs the source syntax field(s) {missing}: pass the output of `MgsaProcessor` "
                f"(e.g. `model(**processor(texts, return_tensors='pt'))`)."
            )
        length = self.padding_mask.shape[-1]
        for name in names:
            if getattr(self, name).shape[-1] != length:
                raise ValueError(
                    f"`{name}` has length {getattr(self, name).shape[-1]} but `input_ids` has length {length}: syntax "
                    "fields must be padded and truncated together with the tokens."
                )


def require_inputs(syntax, inputs_class: type, layer: object) -> None:
    """A clear error when a variant's layer is called without the inputs its encoder makes for it once per forward
    ([`Variant.layer_inputs`])."""
    if not isinstance(syntax, inputs_class):
        raise ValueError(
            f"{type(layer).__name__} reads `syntax={inputs_class.__name__}.from_syntax(config, MgsaSyntaxInputs(...), "
            f"hidden_states)`, as the encoder passes it; got {type(syntax).__name__}."
        )


@dataclass
class MgsaLayerOutput:
    """
    What an encoder layer contributes besides its hidden states: a layer returns it beside its hidden states (what
    its self-attention returned as its third output, or what the layer's own sub-layers made), and the encoder gathers
    the layers' into [`MgsaEncoderOutput`] ([`gather`]). Plain layers return it empty.

    Attributes:
        tag_loss (`(B,)`): MG-SA phrase-tag cross-entropy per sentence (Eq. 10).
        gates (`(B, L)` or `(B, H, L)`): hybrid local/global gates (Eq. 5).
        head_labels (`(B, H)`): RHE head labels, 1 = important, 0 = redundant (Eq. 10).
        phrase_states (tuple of `(B, P, D)`): PR phrase vectors pooled by this layer, from its input (level k for layer
            k) and, in the last layer, from its output (level d).
        phrase_mask (`(B, P)`): PR, `True` on real phrases.
    """

    tag_loss: torch.Tensor | None = None
    gates: torch.Tensor | None = None
    head_labels: torch.LongTensor | None = None
    phrase_states: tuple[torch.Tensor, ...] = ()
    phrase_mask: torch.BoolTensor | None = None

    def to_tuple(self) -> tuple[torch.Tensor | None, ...]:
        """The fields as one flat tuple (tensors and Nones), the phrase levels last; [`from_tuple`] rebuilds it."""
        return (self.tag_loss, self.gates, self.head_labels, self.phrase_mask, *self.phrase_states)

    @classmethod
    def from_tuple(cls, values: tuple[torch.Tensor | None, ...]) -> "MgsaLayerOutput":
        tag_loss, gates, head_labels, phrase_mask, *phrase_states = values
        return cls(tag_loss, gates, head_labels, tuple(phrase_states), phrase_mask)

    @staticmethod
    def gather(layer_outputs: list["MgsaLayerOutput"]) -> dict[str, object]:
        """The [`MgsaEncoderOutput`] fields of the layers' contributions, in layer order: the mean of the tag losses,
        the gates and head labels of each layer that has them, PR's phrase levels stacked as (B, levels, P, D) and the
        phrase mask (every layer's is the same)."""

        def present(name: str) -> list:
            return [getattr(output, name) for output in layer_outputs if getattr(output, name) is not None]

        tag_losses, phrase_masks = present("tag_loss"), present("phrase_mask")
        phrase_states = [states for output in layer_outputs for states in output.phrase_states]
        return {
            "tag_loss": torch.stack(tag_losses).mean(0) if tag_losses else None,
            "gates": tuple(present("gates")) or None,
            "head_labels": tuple(present("head_labels")) or None,
            "phrase_states": torch.stack(phrase_states, dim=1) if phrase_states else None,
            "phrase_mask": phrase_masks[0] if phrase_masks else None,
        }


# The field of transformers' model outputs holding the decoder cache: `cache` from transformers 5.24 (where the old
# name still works but logs a deprecation warning), `past_key_values` before.
OUTPUT_CACHE_FIELD = "cache" if "cache" in {field.name for field in fields(Seq2SeqLMOutput)} else "past_key_values"


def resolve_cache(past_key_values: Cache | None, kwargs: dict) -> Cache | None:
    """The decoder cache of a forward call: transformers >= 5.24 names it `cache` (and `generate` passes it so), the
    earlier versions `past_key_values`; `cache` is taken out of `kwargs` so that it reaches no layer as a stray
    keyword."""
    cache = kwargs.pop("cache", None)
    if cache is not None and past_key_values is not None:
        raise ValueError("Pass the decoder cache as `cache` or as `past_key_values`, not both.")
    return cache if cache is not None else past_key_values


def additive_mask(allowed: torch.BoolTensor, dtype: torch.dtype) -> torch.Tensor:
    """An attention kernel's additive mask: 0 where `allowed`, the dtype's minimum elsewhere (same shape)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    position_bias: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(QKᵀ·scaling + position_bias + mask)·V on (B, H, T, d_h) tensors; returns the context as (B, T, H, d_h)
    and the weights."""
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if position_bias is not None:
        attn_weights = attn_weights + position_bias
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


@dataclass(frozen=True)
class AttentionLayout:
    """How a backbone names and shapes its attention projections, so that its checkpoints load into every variant."""

    query: str
    key: str
    value: str
    output: str
    bias: bool
    scaled: bool  # QKᵀ / √d_h (Marian); T5 does not scale and folds the factor into the query initialisation


ATTENTION_LAYOUTS = {
    "marian": AttentionLayout("q_proj", "k_proj", "v_proj", "out_proj", bias=True, scaled=True),
    "t5": AttentionLayout("q", "k", "v", "o", bias=False, scaled=False),
}


class MgsaAttention(nn.Module):
    """
    Multi-head attention from "Attention Is All You Need", the one core every variant extends. Its projections carry
    the backbone's parameter names (`config.backbone`, see [`ATTENTION_LAYOUTS`]: Marian's `q_proj`, `k_proj`,
    `v_proj`, `out_proj` with biases; T5's `q`, `k`, `v`, `o` without), reached under the same names `query_proj`,
    `key_proj`, `value_proj`, `output_proj` whatever the backbone. Encoder variants subclass it and override
    [`forward`] for encoder self-attention, reusing [`split_heads`], [`energy`], [`attend`] (the kernel) and
    [`merge_heads`].

    T5's relative position bias (`position_bias`, (1, H, T, S)) is added to the attention logits; the first
    self-attention of a T5 stack owns the bias table (`has_relative_attention_bias`, T5's `relative_attention_bias`).
    """

    # attention backends (`config._attn_implementation`) a subclass runs with; None: every backend transformers has
    supported_attn_implementations: tuple[str, ...] | None = None

    def __init__(
        self,
        config,
        num_heads: int,
        is_decoder: bool = False,
        is_causal: bool = False,
        layer_idx=None,
        *,
        has_relative_attention_bias: bool = False,
        key_bias: bool = True,
        output_dim: int | None = None,
    ):
        super().__init__()
        self.config = config
        self.layout = ATTENTION_LAYOUTS[config.backbone]
        self.embed_dim = config.d_model
        self.num_heads = num_heads
        self.head_dim = getattr(config, "d_kv", None) or self.embed_dim // num_heads
        self.inner_dim = num_heads * self.head_dim
        self.scaling = self.head_dim**-0.5 if self.layout.scaled else 1.0
        self.dropout = config.attention_dropout
        self.is_decoder = is_decoder
        self.is_causal = is_causal
        self.layer_idx = layer_idx

        bias = self.layout.bias
        self.add_module(self.layout.key, nn.Linear(self.embed_dim, self.inner_dim, bias=bias and key_bias))
        self.add_module(self.layout.value, nn.Linear(self.embed_dim, self.inner_dim, bias=bias))
        self.add_module(self.layout.query, nn.Linear(self.embed_dim, self.inner_dim, bias=bias))
        self.add_module(self.layout.output, nn.Linear(self.inner_dim, output_dim or self.embed_dim, bias=bias))
        if has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, num_heads)

    @property
    def query_proj(self) -> nn.Linear:
        return self._modules[self.layout.query]

    @property
    def key_proj(self) -> nn.Linear:
        return self._modules[self.layout.key]

    @property
    def value_proj(self) -> nn.Linear:
        return self._modules[self.layout.value]

    @property
    def output_proj(self) -> nn.Linear:
        return self._modules[self.layout.output]

    def split_heads(self, states: torch.Tensor) -> torch.Tensor:
        """(B, T, H·d_h) → (B, H, T, d_h)."""
        return states.view(*states.shape[:-1], -1, self.head_dim).transpose(1, 2)

    def merge_heads(self, context: torch.Tensor) -> torch.Tensor:
        """Context (B, H, T, d_h) → output projection of (B, T, D)."""
        context = context.transpose(1, 2)
        return self.output_proj(context.reshape(*context.shape[:2], self.inner_dim))

    def energy(
        self, query: torch.Tensor, key: torch.Tensor, position_bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention logits (B, H, T, S) of queries and keys (B, H, ·, d_h), with T5's relative bias when given."""
        energy = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
        return energy if position_bias is None else energy + position_bias

    def check_attn_implementation(self) -> None:
        """A clear error when the configured attention backend is one this variant does not run with (instead of a
        crash inside the kernel or a silent fallback)."""
        backend = self.config._attn_implementation
        supported = self.supported_attn_implementations
        if supported is not None and backend is not None and backend not in supported:  # None: a bare layer, SDPA
            raise ValueError(
                f"{type(self).__name__} (encoder_type={self.config.encoder_type!r}) runs with attn_implementation "
                f"in {list(supported)}, got {backend!r}: load or build the model with attn_implementation='sdpa' "
                f"(or 'eager' for the explicit attention weights), or call `model.set_attn_implementation('sdpa')`."
            )

    def attention_dropout(self, weights: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(weights, p=self.dropout, training=self.training)

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        bias: torch.Tensor | None,
        position_bias: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """
        softmax(QKᵀ · scaling + position_bias + bias) V, attention dropout included, with the kernel of
        `config._attn_implementation` (eager, sdpa, flash, flex: `set_attn_implementation` switches it, as for
        Marian and T5; a variant's `supported_attn_implementations` limit it).

        Args:
            query: (B, H, T, d_h); key, value: (B, H, S, d_h).
            bias: additive mask (or bias) broadcastable to (B, H, T, S), or None.
            position_bias: T5's relative position bias (1, H, T, S), or None.

        Returns:
            `(context (B, T, H, d_h), weights (B, H, T, S) with the eager kernel, else None)`.
        """
        self.check_attn_implementation()
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        if position_bias is not None:
            kwargs["position_bias"] = position_bias
        return attention_interface(
            self, query, key, value, bias, dropout=self.dropout if self.training else 0.0, scaling=self.scaling,
            **kwargs,
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        syntax: MgsaSyntaxInputs | None = None,
        position_bias: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None, "MgsaLayerOutput | None"]:
        """
        Args:
            hidden_states: (B, T, D) queries (and keys/values for self-attention).
            key_value_states: (B, S, D) encoder states for cross-attention.
            past_key_values: the decoder cache.
            attention_mask: additive mask broadcastable to (B, H, T, S), as made by `transformers.masking_utils`.
            syntax: what the encoder's layers read (the variant's inputs); unused by plain attention.
            position_bias: T5's relative position bias (1, H, T, S), or None.

        Returns:
            `(output (B, T, D), attention weights (B, H, T, S) or None, what it contributes to the layer's
            [`MgsaLayerOutput`] or None)`: every self-attention returns these three, a variant's its contribution.
        """
        is_cross_attention = key_value_states is not None
        query_states = self.split_heads(self.query_proj(hidden_states))

        is_updated = False
        cache = past_key_values
        if isinstance(past_key_values, EncoderDecoderCache):
            is_updated = past_key_values.is_updated.get(self.layer_idx)
            cache = (
                past_key_values.cross_attention_cache if is_cross_attention else past_key_values.self_attention_cache
            )

        if is_cross_attention and is_updated:
            key_states = cache.layers[self.layer_idx].keys
            value_states = cache.layers[self.layer_idx].values
        else:
            current_states = key_value_states if is_cross_attention else hidden_states
            key_states = self.split_heads(self.key_proj(current_states))
            value_states = self.split_heads(self.value_proj(current_states))
            if past_key_values is not None:
                key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
                if is_cross_attention and isinstance(past_key_values, EncoderDecoderCache):
                    past_key_values.is_updated[self.layer_idx] = True

        attn_output, attn_weights = self.attend(
            query_states, key_states, value_states, attention_mask, position_bias=position_bias, **kwargs
        )
        attn_output = attn_output.reshape(*hidden_states.shape[:-1], -1).contiguous()
        return self.output_proj(attn_output), attn_weights, None


def checkpoint_layer(checkpoint: Callable, layer_call: Callable, *args):
    """
    `checkpoint(layer_call, *args)` (torch's checkpoint with the model's settings) such that every tensor a layer reads
    or returns gets its gradient, with reentrant checkpointing (`use_reentrant=True`) too. That kind only reaches the
    tensors passed and returned at the top level: a keyword tensor that requires grad (T5's position bias, PR's source
    phrases) would be recomputed against the graph outside the layer, whose backward then runs once per layer
    ("Trying to backward through the graph a second time"), and the tensors inside a layer's [`MgsaLayerOutput`]
    (MG-SA's tag loss, PR's phrases), computed without grad, would get none. So the keyword tensors of `layer_call` (a
    `functools.partial`, as `GradientCheckpointingLayer` makes it) go in positionally, and the layer's contribution
    (and the tensors after it: T5's position bias) comes out as a flat tuple.
    """
    if not isinstance(layer_call, partial):
        return checkpoint(layer_call, *args)
    keywords = dict(layer_call.keywords)
    tensor_names = [name for name, value in keywords.items() if isinstance(value, torch.Tensor)]
    passed_on = None  # with a contribution: how many outputs follow it

    def run(*inputs):
        nonlocal passed_on
        layer_args, tensors = inputs[: len(args)], inputs[len(args) :]
        layer_keywords = {**keywords, **dict(zip(tensor_names, tensors, strict=True))}
        output = layer_call.func(*layer_call.args, *layer_args, **layer_keywords)
        if isinstance(output, tuple) and len(output) >= 2 and isinstance(output[1], MgsaLayerOutput):
            passed_on = len(output) - 2
        return output if passed_on is None else (output[0], *output[2:], *output[1].to_tuple())

    output = checkpoint(run, *args, *(keywords[name] for name in tensor_names))
    if passed_on is not None:  # (hidden_states, *rest, *contribution) -> (hidden_states, MgsaLayerOutput, *rest)
        return output[0], MgsaLayerOutput.from_tuple(output[1 + passed_on :]), *output[1 : 1 + passed_on]
    return output


class MgsaCheckpointingLayer(GradientCheckpointingLayer):
    """A `GradientCheckpointingLayer` that checkpoints through [`checkpoint_layer`], so that reentrant checkpointing
    gives the same gradients as the non-reentrant kind (and as no checkpointing)."""

    @property
    def _gradient_checkpointing_func(self) -> Callable:
        return partial(checkpoint_layer, self._checkpoint_func)

    @_gradient_checkpointing_func.setter
    def _gradient_checkpointing_func(self, checkpoint: Callable) -> None:
        # what `gradient_checkpointing_enable` sets: torch's checkpoint with the model's settings
        self._checkpoint_func = checkpoint


class MgsaDecoderKwargs(TransformersKwargs, total=False):
    """
    The keyword arguments of a decoder's forward: [`~transformers.utils.TransformersKwargs`] and what a variant's
    decoder layers read from the source besides its hidden states ([`MgsaEncoderOutput.source_memories`]).

    encoder_phrase_states (`torch.FloatTensor` of shape `(batch_size, encoder_layers + 1, num_phrases, d_model)`):
        PR: the source phrases of every encoder level.
    encoder_phrase_mask (`torch.BoolTensor` of shape `(batch_size, num_phrases)`):
        PR: `True` for real phrases.
    """

    encoder_phrase_states: torch.FloatTensor
    encoder_phrase_mask: torch.BoolTensor


@dataclass
class MgsaEncoderOutput(BaseModelOutput):
    r"""
    tag_loss (`torch.FloatTensor` of shape `(batch_size,)`, *optional*):
        MG-SA phrase-tag cross-entropy per sentence (Eq. 10: summed over its tagged phrases of every level; averaged
        over the supervised layers), when the model predicts tags and the batch carries `phrase_tags`. Per sentence so
        that it expands with beams.
    gates (`tuple(torch.FloatTensor)`, *optional*):
        Hybrid: per variant layer, the local/global gate `(batch_size, seq_len)` or `(batch_size, heads, seq_len)`.
    head_labels (`tuple(torch.LongTensor)`, *optional*):
        RHE: per variant layer, `(batch_size, heads)` with 1 for important and 0 for redundant heads.
    phrase_states (`torch.FloatTensor` of shape `(batch_size, encoder_layers + 1, num_phrases, d_model)`, *optional*):
        PR: the source phrase representations of the embeddings and of every encoder layer.
    phrase_mask (`torch.BoolTensor` of shape `(batch_size, num_phrases)`, *optional*):
        PR: `True` for real phrases.
    """

    tag_loss: torch.FloatTensor | None = None
    gates: tuple[torch.FloatTensor, ...] | None = None
    head_labels: tuple[torch.LongTensor, ...] | None = None
    phrase_states: torch.FloatTensor | None = None
    phrase_mask: torch.BoolTensor | None = None

    def source_memories(self) -> dict[str, torch.Tensor]:
        """What a variant's decoder layers read from the source besides its hidden states, as keyword arguments for
        the decoder (PR: `encoder_phrase_states`, `encoder_phrase_mask`); empty for the other variants."""
        if self.phrase_states is None:
            return {}
        return {"encoder_phrase_states": self.phrase_states, "encoder_phrase_mask": self.phrase_mask}


# the encoder's fields that the encoder-decoder outputs carry as `encoder_<field>`
SEQ2SEQ_ENCODER_FIELDS = ("tag_loss", "gates", "head_labels")


@dataclass
class MgsaSeq2SeqModelOutput(Seq2SeqModelOutput):
    r"""
    encoder_tag_loss, encoder_gates, encoder_head_labels:
        The encoder's [`MgsaEncoderOutput`] fields of the same names.
    """

    encoder_tag_loss: torch.FloatTensor | None = None
    encoder_gates: tuple[torch.FloatTensor, ...] | None = None
    encoder_head_labels: tuple[torch.LongTensor, ...] | None = None


@dataclass
class MgsaSeq2SeqLMOutput(Seq2SeqLMOutput):
    r"""
    translation_loss (`torch.FloatTensor`, *optional*):
        The cross-entropy of the labels alone (label-smoothed by `config.label_smoothing`); `loss` adds
        `phrase_tag_loss_weight * tag_loss` when there is one.
    tag_loss (`torch.FloatTensor`, *optional*):
        MG-SA phrase-tag loss of the batch (mean of the encoder's per-sentence `tag_loss`).
    encoder_gates, encoder_head_labels:
        See [`MgsaEncoderOutput`]; returned with `output_gates=True` / `output_head_labels=True`.
    """

    translation_loss: torch.FloatTensor | None = None
    tag_loss: torch.FloatTensor | None = None
    encoder_gates: tuple[torch.FloatTensor, ...] | None = None
    encoder_head_labels: tuple[torch.LongTensor, ...] | None = None


def encoder_output(hidden_states: torch.Tensor, layer_outputs: list[MgsaLayerOutput]) -> MgsaEncoderOutput:
    """The encoder output (either backbone): the last hidden states and what the layers contributed
    ([`MgsaLayerOutput.gather`])."""
    return MgsaEncoderOutput(last_hidden_state=hidden_states, **MgsaLayerOutput.gather(layer_outputs))


def check_length(tokens: torch.Tensor, past_length: int | torch.Tensor, limit: int, side: str) -> None:
    """A clear error instead of an index error deep inside the position embedding when a sequence (B, T, ...) that
    follows `past_length` cached tokens is longer than the model's `max_position_embeddings`. A static cache counts
    its tokens in a tensor: under `torch.compile` that count is checked on the device, without a graph break."""
    length = past_length + tokens.shape[1]
    if isinstance(length, torch.Tensor) and torch.compiler.is_compiling():
        torch._assert_async(length <= limit, f"The {side} sequence is longer than `max_position_embeddings`")
        return
    if length > limit:
        hint = (f"tokenize with `truncation=True, max_length={limit}`" if side == "source"
                else f"generate at most {limit} tokens (`max_new_tokens`)")
        raise ValueError(f"The {side} sequence has {int(length)} tokens but the model has position embeddings for "
                         f"`max_position_embeddings` = {limit}: {hint}.")


def as_encoder_output(encoder_outputs) -> MgsaEncoderOutput:
    """Accept what users and `generate` pass as `encoder_outputs`: our output, a `BaseModelOutput` or a tuple."""
    if isinstance(encoder_outputs, MgsaEncoderOutput):
        return encoder_outputs
    if isinstance(encoder_outputs, BaseModelOutput):
        return MgsaEncoderOutput(**encoder_outputs)
    return MgsaEncoderOutput(
        last_hidden_state=encoder_outputs[0],
        hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
        attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
    )


def encoder_decoder_forward(
    model: PreTrainedModel,
    input_ids: torch.LongTensor | None,
    attention_mask: torch.Tensor | None,
    decoder_input_ids: torch.LongTensor | None,
    decoder_attention_mask: torch.Tensor | None,
    encoder_outputs,
    past_key_values: Cache | None,
    inputs_embeds: torch.Tensor | None,
    decoder_inputs_embeds: torch.Tensor | None,
    use_cache: bool | None,
    syntax: MgsaSyntaxInputs,
    **kwargs: Unpack[TransformersKwargs],
) -> MgsaSeq2SeqModelOutput:
    """
    The encoder-decoder pass of both backbones: encode the source with its `syntax` (unless `encoder_outputs` are
    given, as `generate` does), then decode against the source states and the variant's other source memories (PR's
    phrases).
    """
    past_key_values = resolve_cache(past_key_values, kwargs)
    if encoder_outputs is None:
        encoder_outputs = model.get_encoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            syntax=syntax,
            **kwargs,
        )
    encoder_outputs = as_encoder_output(encoder_outputs)
    decoder_outputs = model.get_decoder()(
        input_ids=decoder_input_ids,
        attention_mask=decoder_attention_mask,
        encoder_hidden_states=encoder_outputs.last_hidden_state,
        encoder_attention_mask=attention_mask,
        past_key_values=past_key_values,
        inputs_embeds=decoder_inputs_embeds,
        use_cache=use_cache,
        **encoder_outputs.source_memories(),
        **kwargs,
    )
    return MgsaSeq2SeqModelOutput(
        last_hidden_state=decoder_outputs.last_hidden_state,
        **{OUTPUT_CACHE_FIELD: getattr(decoder_outputs, OUTPUT_CACHE_FIELD)},
        decoder_hidden_states=decoder_outputs.hidden_states,
        decoder_attentions=decoder_outputs.attentions,
        cross_attentions=decoder_outputs.cross_attentions,
        encoder_last_hidden_state=encoder_outputs.last_hidden_state,
        encoder_hidden_states=encoder_outputs.hidden_states,
        encoder_attentions=encoder_outputs.attentions,
        **{f"encoder_{name}": getattr(encoder_outputs, name) for name in SEQ2SEQ_ENCODER_FIELDS},
    )


def check_tag_supervision_inputs(model, labels, phrase_tags, encoder_outputs) -> None:
    """
    MG-SA's tag loss (Eq. 10) needs the batch's `phrase_tags` and a loss computed by the model: a training forward
    that runs the encoder with `labels` but no `phrase_tags` raises, and one without `labels` (a Trainer that
    computes the loss from the logits: `label_smoothing_factor`, `compute_loss_func`) warns once that the loss leaves
    the tag term out. Forwards in eval mode, or on given `encoder_outputs` (as in `generate`), need neither.
    """
    if not model.config.trains_tag_loss:
        return
    if not model.training or encoder_outputs is not None:
        return
    if labels is not None and phrase_tags is None:
        raise ValueError(
            "`phrase_tag_supervision=True` trains a tag classifier on the batch's `phrase_tags`, which this batch "
            "lacks. Make the batches with the processor of the model's `phrase_levels` (`MgsaProcessor(..., "
            "phrase_levels=config.phrase_levels)`, which returns `phrase_tags` beside `phrase_ids`) and batch them "
            "with `MgsaDataCollator`, or set `phrase_tag_supervision=False`."
        )
    if labels is None and not getattr(model, "tag_loss_added_by_caller", False):
        logger.warning_once(
            "`phrase_tag_supervision=True`, but the model is training without `labels`: the caller computes the "
            "loss from the logits (a Trainer with `label_smoothing_factor` > 0 or `compute_loss_func`), and that loss "
            "leaves out the tag loss (the classifier does not train). Train with `MgsaSeq2SeqTrainer`, which adds it "
            "back, or set the model's `label_smoothing` field instead of the Trainer's `label_smoothing_factor`."
        )


def tag_loss_per_target_token(
    tag_loss: torch.Tensor, labels: torch.LongTensor, num_items_in_batch: torch.Tensor | int | None = None
) -> torch.Tensor:
    """
    MG-SA's tag loss on the scale of a translation loss that is a mean over target tokens. Eq. 12 of Hao et al.
    (2019) adds λ · L_tag to the translation log-likelihood, both summed per sentence; the translation loss here is
    that sum over the batch divided by its target tokens (`labels` (B, T), -100 ignored, or `num_items_in_batch`, the
    tokens of the whole accumulated batch), so the tag term is the batch's sum of sentence tag losses (`tag_loss`,
    their mean, times B) over the same count.
    """
    return per_target_token(tag_loss * labels.shape[0], labels, num_items_in_batch)  # 0 without target tokens


def translation_loss(
    logits: torch.Tensor,
    labels: torch.LongTensor,
    label_smoothing: float = 0.0,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """
    The cross-entropy of `logits` (B, T, V) against `labels` (B, T) (-100 ignored), label-smoothed by ε =
    `label_smoothing` as the Trainer's `LabelSmoother` does: (1 − ε) NLL + ε · mean_v(−log p_v) (Szegedy et al.,
    2016; Vaswani et al., 2017 §5.4). The mean over the target tokens, or, with `num_items_in_batch` (the Trainer's
    count of the target tokens of the whole accumulated batch), this batch's sum over that count.
    """
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, label_smoothing=label_smoothing,
        reduction="sum",
    )  # a batch without target tokens: 0 (a mean of no tokens would be NaN, and so would every gradient)
    return loss / at_least_one(target_token_count(labels, num_items_in_batch, loss.device)).to(loss.dtype)


def with_tag_loss(
    loss: torch.Tensor,
    tag_loss: torch.Tensor | None,
    weight: float,
    labels: torch.LongTensor,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """MG-SA's Eq. 12: the translation `loss` plus λ = `weight` times the batch's tag loss on its scale
    ([`tag_loss_per_target_token`]); `loss` itself without a tag loss. The models, `MgsaSeq2SeqTrainer` and the
    benchmark loop all add it here."""
    if tag_loss is None:
        return loss
    return loss + weight * tag_loss_per_target_token(tag_loss, labels, num_items_in_batch)


def language_model_output(
    config,
    outputs: MgsaSeq2SeqModelOutput,
    lm_logits: torch.Tensor,
    labels: torch.LongTensor | None,
    output_gates: bool | None,
    output_head_labels: bool | None,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> MgsaSeq2SeqLMOutput:
    """
    Both backbones' LM output: the translation loss of `lm_logits` (B, T, V) against `labels` (B, T)
    ([`translation_loss`] with `config.label_smoothing`) plus `phrase_tag_loss_weight` times MG-SA's tag loss (Eq. 10
    on the translation loss's scale, [`with_tag_loss`]), and the analysis outputs that were asked for.

    Without `num_items_in_batch` the translation loss is the mean over the batch's target tokens. The Trainer passes
    the number of target tokens of the whole accumulated batch (over its processes) as `num_items_in_batch`: then
    both terms are this batch's sums over that number, so that the accumulated loss is the whole batch's.
    """
    translation = loss = None
    tag_loss = outputs.encoder_tag_loss.mean() if outputs.encoder_tag_loss is not None else None
    if labels is not None:
        translation = translation_loss(lm_logits, labels, config.label_smoothing, num_items_in_batch)
        loss = with_tag_loss(translation, tag_loss, config.phrase_tag_loss_weight, labels, num_items_in_batch)
    return MgsaSeq2SeqLMOutput(
        loss=loss,
        logits=lm_logits,
        **{OUTPUT_CACHE_FIELD: getattr(outputs, OUTPUT_CACHE_FIELD)},
        decoder_hidden_states=outputs.decoder_hidden_states,
        decoder_attentions=outputs.decoder_attentions,
        cross_attentions=outputs.cross_attentions,
        encoder_last_hidden_state=outputs.encoder_last_hidden_state,
        encoder_hidden_states=outputs.encoder_hidden_states,
        encoder_attentions=outputs.encoder_attentions,
        translation_loss=translation,
        tag_loss=tag_loss,
        encoder_gates=outputs.encoder_gates if output_gates else None,
        encoder_head_labels=outputs.encoder_head_labels if output_head_labels else None,
    )


class MgsaSeq2SeqModelMixin:
    """The forward of both backbones' bare encoder-decoders ([`MgsaModel`], [`MgsaT5Model`])."""

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        word_ids: torch.LongTensor | None = None,
        head_word_ids: torch.LongTensor | None = None,
        phrase_ids: torch.LongTensor | None = None,
        phrase_tags: torch.LongTensor | None = None,
        pr_phrase_ids: torch.LongTensor | None = None,
        local_phrase_start: torch.LongTensor | None = None,
        local_phrase_end: torch.LongTensor | None = None,
        tree_depth: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MgsaSeq2SeqModelOutput:
        r"""
        Arguments are those of the backbone's bare model ([`~transformers.MarianModel`], [`~transformers.T5Model`])
        plus the source syntax fields of its encoder.
        """
        syntax = MgsaSyntaxInputs.pack(locals())
        return encoder_decoder_forward(
            self, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, encoder_outputs,
            past_key_values, inputs_embeds, decoder_inputs_embeds, use_cache, syntax, **kwargs,
        )


class MgsaForConditionalGenerationMixin:
    """
    The forward of both backbones' translation models ([`MgsaForConditionalGeneration`],
    [`MgsaT5ForConditionalGeneration`]): decoder inputs from the labels (`prepare_decoder_input_ids_from_labels`),
    the encoder-decoder pass, the backbone's language-model head (`language_model_logits`) and the loss.
    """

    def language_model_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The backbone's vocabulary logits (B, T, V) of the decoder's last states (B, T, D)."""
        raise NotImplementedError

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        word_ids: torch.LongTensor | None = None,
        head_word_ids: torch.LongTensor | None = None,
        phrase_ids: torch.LongTensor | None = None,
        phrase_tags: torch.LongTensor | None = None,
        pr_phrase_ids: torch.LongTensor | None = None,
        local_phrase_start: torch.LongTensor | None = None,
        local_phrase_end: torch.LongTensor | None = None,
        tree_depth: torch.LongTensor | None = None,
        output_gates: bool | None = None,
        output_head_labels: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MgsaSeq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_len)`, *optional*):
            Target token ids; -100 is ignored. The decoder inputs are the labels shifted right.
        output_gates (`bool`, *optional*):
            Return the hybrid encoder's local/global gates as `encoder_gates`.
        output_head_labels (`bool`, *optional*):
            Return RHE's important (1) / redundant (0) head labels as `encoder_head_labels`.

        The other arguments are those of the backbone's translation model ([`~transformers.MarianMTModel`],
        [`~transformers.T5ForConditionalGeneration`]) and the source syntax fields of its encoder.
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        check_tag_supervision_inputs(self, labels, phrase_tags, encoder_outputs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        syntax = MgsaSyntaxInputs.pack(locals())
        outputs = encoder_decoder_forward(
            self, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, encoder_outputs,
            past_key_values, inputs_embeds, decoder_inputs_embeds, use_cache, syntax, **kwargs,
        )
        lm_logits = self.language_model_logits(outputs.last_hidden_state)
        return language_model_output(self.config, outputs, lm_logits, labels, output_gates, output_head_labels,
                                     num_items_in_batch)


class BaseModelAutoMapMixin:
    """Saving a translation model with its code (`register_for_auto_class`, which importing the package does) also
    names its bare encoder-decoder (`base_model_class`) under `AutoModel` in the config's `auto_map`, and the
    translation pipeline under `mgsa-translation` in `custom_pipelines`, so that `AutoModel.from_pretrained(folder,
    trust_remote_code=True)` and `pipeline(model=folder, trust_remote_code=True)` work where this package is not
    installed. `save_pretrained` writes only the saved class's own Auto entry and the code its module imports:
    importing the pipeline here makes it one of those files, so every save (`Trainer.save_model`, `push_to_hub`)
    writes it."""

    base_model_class: type

    def save_pretrained(self, save_directory, *args, **kwargs):
        if self._auto_class is not None:
            from .pipeline_translation import remote_pipelines

            base = self.base_model_class
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}),
                                    "AutoModel": f"{base.__module__.rsplit('.', 1)[-1]}.{base.__name__}"}
            self.config.custom_pipelines = {**(getattr(self.config, "custom_pipelines", None) or {}),
                                            **remote_pipelines()}
        return super().save_pretrained(save_directory, *args, **kwargs)

    def push_to_hub(self, repo_id: str, *args, **kwargs):
        """
        Transformers' `push_to_hub`, which keeps the card a repository has and gives a new one its blank template:
        a model loaded from a folder that holds this package's model card (`README.md` tagged `mgsa-hf`, with the
        scores as `model-index`, as `mgsa-hf train` writes it) gives a repository without a card that card first.
        """
        card_path = Path(str(self.name_or_path)) / "README.md"
        if card_path.is_file() and "mgsa-hf" in (ModelCard.load(card_path).data.tags or []):
            api = HfApi(token=kwargs.get("token"))
            repo_id = api.create_repo(repo_id, private=kwargs.get("private"), exist_ok=True).repo_id
            try:
                ModelCard.load(repo_id, token=kwargs.get("token"))
            except EntryNotFoundError:
                api.upload_file(path_or_fileobj=str(card_path), path_in_repo="README.md", repo_id=repo_id,
                                commit_message="Add the model card")
        return super().push_to_hub(repo_id, *args, **kwargs)


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
