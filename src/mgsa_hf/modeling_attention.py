"""[`MgsaAttention`]: the one multi-head attention core every variant extends, with [`MgsaAttention.attend`]
choosing the kernel (`config._attn_implementation`), and the projection layouts of both backbones."""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .modeling_outputs_mgsa import MgsaLayerOutput
from .modeling_syntax_inputs import MgsaSyntaxInputs


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
        """W_Q, D → H·d_h (Marian's `q_proj`, T5's `q`)."""
        return self._modules[self.layout.query]

    @property
    def key_proj(self) -> nn.Linear:
        """W_K, D → H·d_h (Marian's `k_proj`, T5's `k`)."""
        return self._modules[self.layout.key]

    @property
    def value_proj(self) -> nn.Linear:
        """W_V, D → H·d_h (Marian's `v_proj`, T5's `v`)."""
        return self._modules[self.layout.value]

    @property
    def output_proj(self) -> nn.Linear:
        """W_O, H·d_h → D (Marian's `out_proj`, T5's `o`)."""
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
        """Dropout (`config.attention_dropout`, in training only) on attention weights (B, H, T, S)."""
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
