"""Building blocks shared by every MGSA encoder variant: the source syntax a forward pass carries, the multi-head
attention core (Marian parameter names), and the Marian-compatible encoder and decoder layers.

The attention variants (`phrase_memory.py`, `phrase_representation.py`, `hybrid.py`, `rhe.py`) subclass
[`MgsaAttention`] and the layers here, so that the plain path stays exactly Marian's.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import logging

from .syntax_fields import SOURCE_SYNTAX_PAD_VALUES


logger = logging.get_logger(__name__)


@dataclass
class MgsaSyntaxInputs:
    """
    The source-side inputs of one encoder forward pass, beyond the tokens themselves.

    Field names, shapes and padding values are those of `syntax_fields.py`; every tensor is batch first and aligned
    with `input_ids` (length `L`). `padding_mask` (B, L) is `True` on real tokens. A variant turns the fields it reads
    into what its layers share (phrase partitions, relations) once per forward: `PhraseMemoryInputs`,
    `PhraseRepresentationInputs` and `RheInputs` in the variants' modules.
    """

    padding_mask: torch.BoolTensor
    word_ids: torch.LongTensor | None = None
    head_word_ids: torch.LongTensor | None = None
    phrase_ids: torch.LongTensor | None = None
    phrase_tags: torch.LongTensor | None = None
    pr_phrase_ids: torch.LongTensor | None = None
    local_phrase_start: torch.LongTensor | None = None
    local_phrase_end: torch.LongTensor | None = None
    tree_depth: torch.LongTensor | None = None

    @classmethod
    def for_batch(
        cls, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None, **fields: torch.LongTensor | None
    ) -> "MgsaSyntaxInputs":
        """The syntax of a batch of source embeddings (B, L, D) with its 0/1 `attention_mask` (B, L) (None: no
        padding) and the processor's syntax `fields`."""
        if attention_mask is None:
            padding_mask = torch.ones(inputs_embeds.shape[:2], dtype=torch.bool, device=inputs_embeds.device)
        else:
            padding_mask = attention_mask.bool()
        return cls(padding_mask=padding_mask, **fields)

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


@dataclass
class MgsaLayerOutput:
    """
    What an encoder layer contributes besides its hidden states: a variant layer returns it (its self-attention
    returns it as a third output), the encoder gathers the layers' into [`MgsaEncoderOutput`]. Plain layers return it
    empty.

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


def split_self_attention_outputs(outputs: tuple) -> tuple[torch.Tensor, MgsaLayerOutput]:
    """An encoder self-attention's `(output, weights)` or, for a variant that contributes something,
    `(output, weights, MgsaLayerOutput)` → `(output, contribution)`."""
    return outputs[0], outputs[2] if len(outputs) > 2 else MgsaLayerOutput()


SYNTAX_INPUT_NAMES = tuple(SOURCE_SYNTAX_PAD_VALUES)


def source_syntax_fields(
    word_ids: torch.LongTensor | None,
    head_word_ids: torch.LongTensor | None,
    phrase_ids: torch.LongTensor | None,
    phrase_tags: torch.LongTensor | None,
    pr_phrase_ids: torch.LongTensor | None,
    local_phrase_start: torch.LongTensor | None,
    local_phrase_end: torch.LongTensor | None,
    tree_depth: torch.LongTensor | None,
) -> dict[str, torch.LongTensor | None]:
    """The source syntax fields a model's forward takes, by name, for its encoder (see `syntax_fields.py`)."""
    return {
        "word_ids": word_ids,
        "head_word_ids": head_word_ids,
        "phrase_ids": phrase_ids,
        "phrase_tags": phrase_tags,
        "pr_phrase_ids": pr_phrase_ids,
        "local_phrase_start": local_phrase_start,
        "local_phrase_end": local_phrase_end,
        "tree_depth": tree_depth,
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
    [`forward`] for encoder self-attention, reusing [`split_heads`], [`energy`] and [`merge_heads`].

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

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        syntax: MgsaSyntaxInputs | None = None,
        position_bias: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """
        Args:
            hidden_states: (B, T, D) queries (and keys/values for self-attention).
            key_value_states: (B, S, D) encoder states for cross-attention.
            past_key_values: the decoder cache.
            attention_mask: additive mask broadcastable to (B, H, T, S), as made by `transformers.masking_utils`.
            syntax: the source syntax; unused by plain attention.
            position_bias: T5's relative position bias (1, H, T, S), or None.

        Returns:
            `(output (B, T, D), attention weights (B, H, T, S) or None)`.
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

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        if position_bias is not None:
            kwargs["position_bias"] = position_bias
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*hidden_states.shape[:-1], -1).contiguous()
        return self.output_proj(attn_output), attn_weights


def checkpoint_layer(checkpoint: Callable, layer_call: Callable, *args):
    """
    `checkpoint(layer_call, *args)` (torch's checkpoint with the model's settings) such that every tensor a layer reads
    or returns gets its gradient, with reentrant checkpointing (`use_reentrant=True`) too. That kind only reaches the
    tensors passed and returned at the top level: a keyword tensor that requires grad (T5's position bias, PR's source
    phrases) would be recomputed against the graph outside the layer, whose backward then runs once per layer
    ("Trying to backward through the graph a second time"), and the tensors inside a layer's [`MgsaLayerOutput`]
    (MG-SA's tag loss, PR's phrases), computed without grad, would get none. So the keyword tensors of `layer_call` (a
    `functools.partial`, as `GradientCheckpointingLayer` makes it) go in positionally, and the layer's contribution
    comes out as a flat tuple.
    """
    if not isinstance(layer_call, partial):
        return checkpoint(layer_call, *args)
    keywords = dict(layer_call.keywords)
    tensor_names = [name for name, value in keywords.items() if isinstance(value, torch.Tensor)]
    returns_contribution = False

    def run(*inputs):
        nonlocal returns_contribution
        layer_args, tensors = inputs[: len(args)], inputs[len(args) :]
        layer_keywords = {**keywords, **dict(zip(tensor_names, tensors, strict=True))}
        output = layer_call.func(*layer_call.args, *layer_args, **layer_keywords)
        returns_contribution = (
            isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], MgsaLayerOutput)
        )
        return (output[0], *output[1].to_tuple()) if returns_contribution else output

    output = checkpoint(run, *args, *(keywords[name] for name in tensor_names))
    if returns_contribution:  # (hidden_states, *contribution) -> (hidden_states, MgsaLayerOutput)
        return output[0], MgsaLayerOutput.from_tuple(output[1:])
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


class MgsaPostNormLayer(MgsaCheckpointingLayer):
    """What Marian's encoder and decoder layers share: post-LN residual blocks and the feed-forward sub-layer
    (`fc1`, `fc2`, `final_layer_norm`)."""

    def __init__(self, config, ffn_dim: int, layer_idx: int):
        super().__init__()
        self.embed_dim = config.d_model
        self.layer_idx = layer_idx
        self.dropout = config.dropout
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout
        self.fc1 = nn.Linear(self.embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, self.embed_dim)
        self.final_layer_norm = nn.LayerNorm(self.embed_dim)

    def residual_block(self, residual: torch.Tensor, update: torch.Tensor, layer_norm: nn.LayerNorm) -> torch.Tensor:
        """Post-LN residual connection: LayerNorm(residual + dropout(update))."""
        update = nn.functional.dropout(update, p=self.dropout, training=self.training)
        return layer_norm(residual + update)

    # a sub-layer's residual passes around its norm (pre-norm) or the norm follows the residual (post-LN, Marian)
    pre_norm = False

    def sublayer(
        self, hidden_states: torch.Tensor, function: Callable[[torch.Tensor], torch.Tensor], layer_norm: nn.LayerNorm
    ) -> torch.Tensor:
        """A sub-layer the way this backbone wraps it, for variants that add one (PR): post-LN, as `residual_block`."""
        return self.residual_block(hidden_states, function(hidden_states), layer_norm)

    def make_layer_norm(self) -> nn.LayerNorm:
        """The normalisation of a sub-layer a variant adds."""
        return nn.LayerNorm(self.embed_dim)

    def make_output_layer_norm(self) -> None:
        """Post-LN layer outputs are normalised already: a variant reading them needs no norm of its own."""
        return None

    def feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The position-wise feed-forward sub-layer with its residual block."""
        update = self.activation_fn(self.fc1(hidden_states))
        update = nn.functional.dropout(update, p=self.activation_dropout, training=self.training)
        return self.residual_block(hidden_states, self.fc2(update), self.final_layer_norm)


class MgsaEncoderLayer(MgsaPostNormLayer):
    """
    Marian's post-LN encoder layer. Its self-attention is plain [`MgsaAttention`] or, on the variant's layers, the
    variant's attention module (built by `modeling_mgsa.build_encoder_self_attention`).
    """

    def __init__(self, config, self_attn: MgsaAttention, layer_idx: int):
        super().__init__(config, config.encoder_ffn_dim, layer_idx)
        self.self_attn = self_attn
        self.self_attn_layer_norm = nn.LayerNorm(self.embed_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        syntax: MgsaSyntaxInputs | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, MgsaLayerOutput]:
        """
        Args:
            hidden_states: (B, L, D); attention_mask: additive (B, 1, L, L) or None.
            syntax: what the self-attention reads: [`MgsaSyntaxInputs`] or the variant's inputs made from them.

        Returns:
            `(hidden_states (B, L, D), what the self-attention contributed)`.
        """
        attn_output, contribution = split_self_attention_outputs(
            self.self_attn(hidden_states, attention_mask=attention_mask, syntax=syntax, **kwargs)
        )
        hidden_states = self.residual_block(hidden_states, attn_output, self.self_attn_layer_norm)
        hidden_states = self.feed_forward(hidden_states)
        if hidden_states.dtype == torch.float16 and not torch.isfinite(hidden_states).all():
            clamp_value = torch.finfo(hidden_states.dtype).max - 1000
            hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
        return hidden_states, contribution


class MgsaDecoderLayer(MgsaPostNormLayer):
    """Marian's post-LN decoder layer: causal self-attention → cross-attention → feed-forward."""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, config.decoder_ffn_dim, layer_idx)
        heads = config.decoder_attention_heads
        self.self_attn = MgsaAttention(config, heads, is_decoder=True, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(self.embed_dim)
        self.encoder_attn = MgsaAttention(config, heads, is_decoder=True, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(self.embed_dim)

    def cross_attention(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None,
        past_key_values: Cache | None,
        **kwargs,
    ) -> torch.Tensor:
        """The cross-attention sub-layer over source tokens (PR adds a phrase sub-layer before it)."""
        attn_output, _ = self.encoder_attn(
            hidden_states,
            key_value_states=encoder_hidden_states,
            attention_mask=encoder_attention_mask,
            past_key_values=past_key_values,
        )
        return self.residual_block(hidden_states, attn_output, self.encoder_attn_layer_norm)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = True,
        **kwargs,
    ) -> torch.Tensor:
        """
        Args:
            hidden_states: (B, T, D) target states.
            attention_mask: additive causal mask (B, 1, T, T_past + T) or None.
            encoder_hidden_states: (B, S, D); encoder_attention_mask: additive (B, 1, T, S) or None.
            kwargs: extra source memories a variant's decoder layer reads (PR: `encoder_phrase_states`,
                `encoder_phrase_mask`); ignored here.
        """
        attn_output, _ = self.self_attn(hidden_states, past_key_values=past_key_values, attention_mask=attention_mask)
        hidden_states = self.residual_block(hidden_states, attn_output, self.self_attn_layer_norm)
        if encoder_hidden_states is not None:
            hidden_states = self.cross_attention(
                hidden_states, encoder_hidden_states, encoder_attention_mask, past_key_values, **kwargs
            )
        return self.feed_forward(hidden_states)


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
