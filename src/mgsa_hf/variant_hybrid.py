"""The hybrid variant (`encoder_type="hybrid"`): local/global self-attention with a learned gate, from "Leveraging
Local and Global Patterns for Self-Attention Networks" (Xu et al., ACL 2019). Its configuration fields, its
self-attention and its [`Variant`] (`HYBRID`); the gate analysis of its Figures 3 and 4 is in
`mgsa_hf.evaluation.analysis`."""

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .configuration_fields import at_least, checked_field, items_at_least
from .modeling_attention import MgsaAttention, additive_mask
from .modeling_outputs_mgsa import MgsaLayerOutput
from .modeling_syntax_inputs import MgsaSyntaxInputs
from .modeling_variant import Variant


@dataclass(kw_only=True, repr=False)
class HybridConfigFields:
    r"""
        hybrid_layers (`list[int]`, *optional*, defaults to `[0, 1]`):
            Hybrid: encoder layers with local/global hybrid attention.
        hybrid_window (`int`, defaults to 1):
            Hybrid: local window m, positions with |i - j| <= m.
        hybrid_gate (`str`, defaults to `"token"`):
            Hybrid: one gate per token (`"token"`) or per token and head (`"head"`).
        hybrid_combination (`str`, defaults to `"gate"`):
            Hybrid: `"gate"` (gated sum), `"concat"` (the paper's concatenation ablation) or `"local"` (the local
            pattern alone, Table 1's "+LOCAL PATTERN" row: no new parameters).
    """

    hybrid_layers: list[int] | None = checked_field(None, items_at_least(0, non_empty=False))
    hybrid_window: int = checked_field(1, at_least(1))
    hybrid_gate: Literal["token", "head"] = "token"
    hybrid_combination: Literal["gate", "concat", "local"] = "gate"


class HybridAttention(MgsaAttention):
    """
    Self-attention that mixes a global and a local pattern of one energy ξ_i = Q_i Kᵀ / √d_h per head (Eq. 1):

    - global: softmax(ξ_i) V (Eq. 2);
    - local: softmax(B(ξ_i)) V with B(ξ_i)_j = -∞ outside |i - j| ≤ m (Eq. 3), m = `hybrid_window`;
    - `hybrid_combination="gate"`: Ĥ_i = (1 - g_i) global_i + g_i local_i with g_i = σ(W H_i) (Eqs. 4-5), one gate per
      token (`hybrid_gate="token"`, d_model + 1 parameters) or per token and head (`"head"`);
      `"concat"`: the paper's ablation (Table 1, "+HYBRID (Concate)"), the output projection reads
      [global_i ; local_i]: W_O [global_i ; local_i] + b = W_O^g global_i + W_O^l local_i + b, so the layer adds
      W_O^l (`local_output_proj`, d × d, no bias) to the plain attention's W_O and b (`output_proj`);
      `"local"`: the local pattern alone (Table 1's "+LOCAL PATTERN" row).

    The layer returns its gates in its [`MgsaLayerOutput`]: (B, L) per token or (B, H, L) per head.

    With `attn_implementation="eager"` both distributions are formed as (B, H, L, L) and their gated mix is returned
    as the attention weights (for analysis). Otherwise the global context comes from the configured kernel (SDPA), and
    the local one too for sentences of up to `fused_local_max_length` tokens (the band of Eq. 3 as its mask), from the
    2m + 1 keys of each window for longer ones; the layer keeps no L × L weights for the backward pass (with a fused
    kernel) and returns no weights. Attention dropout
    applies to each distribution. Backends: `eager` and `sdpa` (flex and flash attention's masks cannot take the
    additive masks of the two patterns, so they raise).
    """

    supported_attn_implementations = ("eager", "sdpa")
    # the longest sentences whose local pattern runs as a masked fused kernel (`local_context`); on CPU at Marian base
    # the two forms cost the same between 32 and 64 tokens (`scripts/bench_layer.py`, BENCHMARKS.md)
    fused_local_max_length = 32

    def __init__(self, config, num_heads: int, is_decoder: bool = False, is_causal: bool = False, layer_idx=None,
                 **kwargs):
        super().__init__(config, num_heads, is_decoder=is_decoder, is_causal=is_causal, layer_idx=layer_idx, **kwargs)
        self.window = config.hybrid_window
        self.combination = config.hybrid_combination
        self.per_head_gate = config.hybrid_gate == "head"
        if self.combination == "gate":
            # W of Eq. 5
            self.gate_proj = nn.Linear(self.embed_dim, num_heads if self.per_head_gate else 1)
        elif self.combination == "concat":
            # the local half of the output projection over [global ; local]; `output_proj` is its global half
            self.local_output_proj = nn.Linear(self.inner_dim, self.output_proj.out_features, bias=False)

    # the gate's bias when a converted checkpoint's layer starts as its plain attention: g = σ(-8) ≈ 3.4e-4
    identity_gate_bias = -8.0

    @torch.no_grad()
    def init_as_identity(self) -> bool:
        """
        Start this layer so that it computes what the plain self-attention of the checkpoint it upgrades computed
        (`load_as_mgsa`): `"concat"` exactly (the output projection reads the global half of [global ; local] as the
        plain attention did and the local half not at all: W_O^l = 0), `"gate"` to within g ≈ 3.4e-4 of it (W = 0
        and the bias at −8 in Eq. 5, so g_i = σ(−8) on every token: an exact 0 would need an infinite bias, and the
        gate still trains, Adam's steps being as large for a small gradient as for a large one). `"local"` cannot
        start as the global pattern.

        Returns:
            Whether the layer starts exactly as the plain attention.
        """
        if self.combination == "concat":
            self.local_output_proj.weight.zero_()
            return True
        if self.combination == "gate":
            self.gate_proj.weight.zero_()
            self.gate_proj.bias.fill_(self.identity_gate_bias)
        return False

    def attention_distributions(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        padding_mask: torch.BoolTensor,
        position_bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """
        The global (Eq. 2) and local (Eq. 3) distributions of one energy.

        Args:
            query, key: (B, H, L, d_h); padding_mask: (B, L), `True` on real tokens (padding keys get no weight).
            position_bias: T5's relative position bias (1, H, L, L), part of the energy; None for Marian.

        Returns:
            `(global, local)` attention weights, each (B, H, L, L).
        """
        energy = self.energy(query, key, position_bias)  # Eq. 1
        minimum = torch.finfo(energy.dtype).min
        energy = energy.masked_fill(~padding_mask[:, None, None, :], minimum)
        global_weights = nn.functional.softmax(energy, dim=-1)
        local_weights = nn.functional.softmax(energy.masked_fill(~self.window_band(energy), minimum), dim=-1)
        return global_weights, local_weights

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        syntax: MgsaSyntaxInputs | None = None,
        position_bias: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None, MgsaLayerOutput]:
        """
        Encoder self-attention. `hidden_states` (B, L, D). Padding comes from `syntax.padding_mask` (B, L) (all real
        when `syntax` is None); the additive `attention_mask` is not read. T5's `position_bias` (1, H, L, L) joins the
        energy that both distributions share.

        Returns:
            `(output (B, L, D), attention weights (B, H, L, L), MgsaLayerOutput with the gates)`: the weights are the
            gated mix of the two distributions, the global one for `"concat"`, the local one for `"local"`, and None
            unless `attn_implementation="eager"`; the gates are None for `"concat"` and `"local"`.
        """
        if key_value_states is not None or past_key_values is not None:
            raise ValueError("HybridAttention is an encoder self-attention: it takes no key_value_states or cache.")
        self.check_attn_implementation()
        padding_mask = (
            syntax.padding_mask
            if syntax is not None
            else torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
        )
        query = self.split_heads(self.query_proj(hidden_states))
        key = self.split_heads(self.key_proj(hidden_states))
        value = self.split_heads(self.value_proj(hidden_states))
        if self.combination == "local":  # Eq. 3 alone
            if self.config._attn_implementation == "eager":
                _, local_weights = self.attention_distributions(query, key, padding_mask, position_bias)
                context = torch.matmul(self.attention_dropout(local_weights), value)
                return self.merge_heads(context), local_weights, MgsaLayerOutput()
            context = self.local_context(query, key, value, padding_mask, position_bias)
            return self.merge_heads(context), None, MgsaLayerOutput()
        if self.config._attn_implementation == "eager":
            global_weights, local_weights = self.attention_distributions(query, key, padding_mask, position_bias)
            global_context = torch.matmul(self.attention_dropout(global_weights), value)  # Eq. 2
            local_context = torch.matmul(self.attention_dropout(local_weights), value)  # Eq. 3
        else:
            global_weights = None
            global_context = self.global_context(query, key, value, padding_mask, position_bias)
            local_context = self.local_context(query, key, value, padding_mask, position_bias)

        if self.combination == "concat":
            # W_O [global ; local] + b, the output projection split into its global and local halves
            local_context = local_context.transpose(1, 2).flatten(2)  # (B, L, H · d_h)
            output = self.merge_heads(global_context) + self.local_output_proj(local_context)
            return output, global_weights, MgsaLayerOutput()

        gates = torch.sigmoid(self.gate_proj(hidden_states)).transpose(1, 2)  # Eq. 5, (B, 1 or H, L)
        # Eq. 4: (1 - g_i) softmax(ξ_i) V + g_i softmax(B(ξ_i)) V
        context = torch.lerp(global_context, local_context, gates.unsqueeze(-1))
        weights = None
        if global_weights is not None:
            weights = torch.lerp(global_weights, local_weights, gates.unsqueeze(-1))
        contribution = MgsaLayerOutput(gates=gates if self.per_head_gate else gates.squeeze(1))
        return self.merge_heads(context), weights, contribution

    def window_band(self, states: torch.Tensor) -> torch.BoolTensor:
        """B(ξ_i)'s band (Eq. 3): (L, L), `True` where |i − j| ≤ m, for the length and device of `states` (·, ·, L,
        ·)."""
        positions = torch.arange(states.shape[2], device=states.device)
        return (positions[:, None] - positions[None, :]).abs() <= self.window

    def global_context(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        padding_mask: torch.BoolTensor,
        position_bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """softmax(ξ_i) V (Eq. 2) with the configured attention kernel: (B, H, L, d_h). Without padding no mask goes to
        the kernel, which can then take its fused path (as the plain layers' mask is None then). Under `torch.compile`
        the mask is always made, so that the graph does not branch on the data."""
        key_mask = None
        if torch.compiler.is_compiling() or not padding_mask.all():
            key_mask = additive_mask(padding_mask[:, None, None, :], query.dtype)
        return self.kernel_context(query, key, value, key_mask, position_bias)

    def local_context(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        padding_mask: torch.BoolTensor,
        position_bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """
        softmax(B(ξ_i)) V (Eq. 3), (B, H, L, d_h). Up to `fused_local_max_length` tokens, the same kernel as the global
        pattern with B(ξ_i) as its mask (the band |i - j| ≤ m and the padding keys, (B, 1, L, L)): one fused kernel
        each way, where the banded form below dispatches about 30 small ones (what a GPU step at these sizes pays
        for), but L² work. Longer sentences take the banded form, whose work grows with L (2m + 1 keys per query).
        """
        length = query.shape[2]
        if length > self.fused_local_max_length:
            return self.banded_local_context(query, key, value, padding_mask, position_bias)
        allowed = self.window_band(query) & padding_mask[:, None, None, :]
        return self.kernel_context(query, key, value, additive_mask(allowed, query.dtype), position_bias)

    def banded_local_context(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        padding_mask: torch.BoolTensor,
        position_bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """
        softmax(B(ξ_i)) V (Eq. 3) from the 2m + 1 keys of each query's window only: offset w of the window is the
        padded keys (values) shifted by w, a view, so neither an L × L tensor nor a copy of the keys per offset is
        formed (and none is kept for the backward pass). Returns (B, H, L, d_h).
        """
        length = query.shape[2]
        window = min(self.window, length - 1)
        width = 2 * window + 1
        padded_keys = nn.functional.pad(key, (0, 0, window, window))
        padded_values = nn.functional.pad(value, (0, 0, window, window))
        # the band of Eq. 1, (B, H, L, 2m + 1): column w of row i is position i + w - m
        energy = torch.stack(
            [(query * padded_keys[:, :, offset : offset + length]).sum(-1) for offset in range(width)], dim=-1
        ) * self.scaling
        if position_bias is not None:
            offsets = torch.arange(-window, window + 1, device=query.device)
            columns = (torch.arange(length, device=query.device)[:, None] + offsets).clamp(0, length - 1)
            energy = energy + position_bias.gather(-1, columns.expand(*position_bias.shape[:2], -1, -1))
        in_window = nn.functional.pad(padding_mask, (window, window)).unfold(1, width, 1)  # (B, L, 2m + 1)
        energy = energy.masked_fill(~in_window[:, None], torch.finfo(energy.dtype).min)
        # CUDA autocast runs softmax in fp32: the weights go back to the values' dtype, so that the context has the
        # fused path's dtype (Eq. 4's gate mixes it with the global context)
        weights = self.attention_dropout(nn.functional.softmax(energy, dim=-1).to(value.dtype))
        context = weights[..., 0, None] * padded_values[:, :, :length]
        for offset in range(1, width):
            context = context + weights[..., offset, None] * padded_values[:, :, offset : offset + length]
        return context

    def kernel_context(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_mask: torch.Tensor | None,
        position_bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """softmax(ξ_i + key_mask) V (Eq. 1 with T5's bias in ξ_i) with the configured attention kernel, attention
        dropout included: query, key, value (B, H, L, d_h), key_mask additive, broadcastable to (B, H, L, L) →
        (B, H, L, d_h)."""
        context, _ = self.attend(query, key, value, key_mask, position_bias, is_causal=False)
        return context.transpose(1, 2)


HYBRID = Variant(
    name="hybrid",
    summary="local/global hybrid self-attention with a learned gate.",
    paper="Leveraging Local and Global Patterns for Self-Attention Networks",
    paper_url="https://aclanthology.org/P19-1295",
    config_fields=HybridConfigFields,
    field_prefixes=("hybrid_",),
    layers_field="hybrid_layers",
    default_layers=(0, 1),
    self_attention=HybridAttention,
    output_fields=("gates",),
)
