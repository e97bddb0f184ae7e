"""Hybrid local/global self-attention (`encoder_type="hybrid"`), from "Leveraging Local and Global Patterns for
Self-Attention Networks" (Xu et al., ACL 2019), and the gate analysis of its Figures 3 and 4."""

import torch
from torch import nn

from .modeling_layers import MgsaAttention, MgsaSyntaxInputs


class HybridAttention(MgsaAttention):
    """
    Self-attention that mixes a global and a local pattern of one energy ξ_i = Q_i Kᵀ / √d_h per head (Eq. 1):

    - global: softmax(ξ_i) V (Eq. 2);
    - local: softmax(B(ξ_i)) V with B(ξ_i)_j = -∞ outside |i - j| ≤ m (Eq. 3), m = `hybrid_window`;
    - `hybrid_combination="gate"`: Ĥ_i = (1 - g_i) global_i + g_i local_i with g_i = σ(W H_i) (Eqs. 4-5), one gate per
      token (`hybrid_gate="token"`, d_model + 1 parameters) or per token and head (`"head"`). As g_i is a scalar per
      query row, the two distributions are mixed first and multiplied with V once;
      `"concat"`: the paper's ablation, a linear projection of [global_i ; local_i] before the output projection.

    The gates are recorded as `syntax.record("gates", ...)`: (B, L) per token or (B, H, L) per head.
    """

    def __init__(self, config, num_heads: int, is_decoder: bool = False, is_causal: bool = False, layer_idx=None):
        super().__init__(config, num_heads, is_decoder=is_decoder, is_causal=is_causal, layer_idx=layer_idx)
        self.window = config.hybrid_window
        self.combination = config.hybrid_combination
        self.per_head_gate = config.hybrid_gate == "head"
        if self.combination == "gate":
            # W of Eq. 5
            self.gate_proj = nn.Linear(self.embed_dim, num_heads if self.per_head_gate else 1)
        else:
            self.concat_proj = nn.Linear(2 * self.embed_dim, self.embed_dim)

    def attention_distributions(
        self, query: torch.Tensor, key: torch.Tensor, padding_mask: torch.BoolTensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """
        The global (Eq. 2) and local (Eq. 3) distributions of one energy.

        Args:
            query, key: (B, H, L, d_h); padding_mask: (B, L), `True` on real tokens (padding keys get no weight).

        Returns:
            `(global, local)` attention weights, each (B, H, L, L).
        """
        energy = torch.matmul(query, key.transpose(-1, -2)) * self.scaling  # Eq. 1
        minimum = torch.finfo(energy.dtype).min
        energy = energy.masked_fill(~padding_mask[:, None, None, :], minimum)
        positions = torch.arange(energy.shape[-1], device=energy.device)
        outside_window = (positions[:, None] - positions[None, :]).abs() > self.window
        global_weights = nn.functional.softmax(energy, dim=-1)
        local_weights = nn.functional.softmax(energy.masked_fill(outside_window, minimum), dim=-1)
        return global_weights, local_weights

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        syntax: MgsaSyntaxInputs | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """
        Encoder self-attention. `hidden_states` (B, L, D). Padding comes from `syntax.padding_mask` (B, L) (all real
        when `syntax` is None); the additive `attention_mask` is not read.

        Returns:
            `(output (B, L, D), attention weights (B, H, L, L))`: the gated mix of the two distributions, or the global
            one for `"concat"`.
        """
        if key_value_states is not None or past_key_values is not None:
            raise ValueError("HybridAttention is an encoder self-attention: it takes no key_value_states or cache.")
        padding_mask = (
            syntax.padding_mask
            if syntax is not None
            else torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
        )
        query = self.split_heads(self.q_proj(hidden_states))
        key = self.split_heads(self.k_proj(hidden_states))
        value = self.split_heads(self.v_proj(hidden_states))
        global_weights, local_weights = self.attention_distributions(query, key, padding_mask)

        if self.combination == "concat":
            global_context = torch.matmul(self.attention_dropout(global_weights), value)
            local_context = torch.matmul(self.attention_dropout(local_weights), value)
            context = torch.cat([global_context, local_context], dim=1).transpose(1, 2).flatten(2)  # [global ; local]
            return self.out_proj(self.concat_proj(context)), global_weights

        gates = torch.sigmoid(self.gate_proj(hidden_states)).transpose(1, 2)  # Eq. 5, (B, 1 or H, L)
        if syntax is not None:
            syntax.record("gates", gates if self.per_head_gate else gates.squeeze(1))
        # Eq. 4: (1 - g_i) softmax(ξ_i) + g_i softmax(B(ξ_i)), then times V
        weights = torch.lerp(global_weights, local_weights, gates.unsqueeze(-1))
        context = torch.matmul(self.attention_dropout(weights), value)
        return self.merge_heads(context), weights
