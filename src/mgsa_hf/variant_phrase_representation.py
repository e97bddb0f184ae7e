"""The PR variant (`encoder_type="phrase_representation"`): source phrase representations, from "Learning Source Phrase
Representations for Neural Machine Translation" (papers/pr-source-phrase-representations.txt). Its configuration
fields, its encoder and decoder layer mixins (put on each backbone's layers) and its [`Variant`]
(`PHRASE_REPRESENTATION`).

Every encoder layer pools phrase vectors from its input with attentive pooling (Eq. 2-5) and attends to them before its
self-attention (attentive combination, Eq. 7-8); every decoder layer attends to the source phrases before the source
tokens, the phrases being a learned mix over the encoder levels 0..d (Transparent Attention, Eq. 6).

Phrases are vectorised over the batch: the in-phrase mean and softmax are (B, P, L) masked weights applied with one
batched matmul, the max glance is a max over (B, P, M) slots gathered from the tokens, so no loop runs over sentences
or phrases.
"""

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask

from .configuration_fields import at_least, checked_field
from .modeling_attention import MgsaAttention
from .modeling_outputs_mgsa import MgsaLayerOutput
from .modeling_syntax_inputs import MgsaSyntaxInputs, require_inputs
from .modeling_variant import Variant


@dataclass(kw_only=True, repr=False)
class PhraseRepresentationConfigFields:
    r"""
        pr_segmentation (`str`, defaults to `"fixed"`):
            PR: `"fixed"` phrases of ntok = max(min(`pr_max_phrase_tokens`, len / `pr_length_ratio`),
            `pr_min_phrase_tokens`) tokens, or `"parse"` (Algorithm 1 phrases from the processor).
        pr_max_phrase_tokens (`int`, defaults to 8):
            PR: the longest phrase of the fixed segmentation rule above, in tokens.
        pr_min_phrase_tokens (`int`, defaults to 3):
            PR: the shortest phrase of the fixed segmentation rule above, in tokens.
        pr_length_ratio (`int`, defaults to 6):
            PR: the fixed segmentation rule's divisor of the sentence length.
        pr_glance (`str`, defaults to `"max"`):
            PR: glance vector of a phrase: `"max"` or `"mean"` pooling.
        pr_attentive (`bool`, defaults to `True`):
            PR: attentive phrase representation (else the glance vector itself is the phrase vector).
        pr_transparent_attention (`bool`, defaults to `True`):
            PR: decoder layers attend to a learned mix of all encoder layers' phrases (else to the last layer's).
        pr_combination_dim (`int`, *optional*):
            PR: hidden size of the attentive combination's 2-layer network (W3, W4 of the paper's Eq. 8, which leaves
            it open); defaults to `3 * d_model`, the width at which Transformer-base's "+Max" row has Table 2's
            parameter count (+40.9M; +37.7M here). `rows/phrase_representation/max_attn_ta_narrow.json` names a
            cheaper 256-wide network (`d_model // 2` at base size).
        pr_pooling_dim (`int`, *optional*):
            PR: hidden size of the attentive pooling's scoring network (W1 of the paper's Eq. 3, which leaves it
            open); defaults to `12 * d_model`, the width at which Transformer-base's "+Max+Attn" rows add Table 2's
            +44.0M over "+Max" (7 poolings of 12 × 512 = 6144 units). A PR config saved before this field existed
            loads with `d_model`, the width it was built with. `rows/phrase_representation/max_attn_ta_narrow*.json`
            name cheaper widths.
        pr_unfolded_output_projection (`bool`, defaults to `False`):
            PR: learn Eq. 7's output projection W_O (D → D) and the half of Eq. 8's W3 that reads out_phrase apart, as
            the paper writes them, instead of as their product (the default, the same family of functions with
            12 (d² + d) parameters fewer at 6 + 6 layers: Table 2's "+Mean"/"+Max" +40.9M come out exactly only
            unfolded; see `AttentivePhraseCombination`).
        pr_centred_sigmoid (`bool`, defaults to `True`):
            PR: Eq. 8 as W4 (σ(h) − ½) + b4, the same functions as the paper's W4 σ(h) + b4 (½ W4 1 moves into b4) but
            without a common-mode direction that Adam grows fast (see `AttentivePhraseCombination`); `False` computes
            Eq. 8 as written, which a PR config saved before this field existed loads with (the function it was
            trained with).
    """

    pr_segmentation: Literal["fixed", "parse"] = "fixed"
    pr_max_phrase_tokens: int = checked_field(8, at_least(1))
    pr_min_phrase_tokens: int = checked_field(3, at_least(1))
    pr_length_ratio: int = checked_field(6, at_least(1))
    pr_glance: Literal["max", "mean"] = "max"
    pr_attentive: bool = True
    pr_transparent_attention: bool = True
    pr_combination_dim: int | None = checked_field(None, at_least(1))
    pr_pooling_dim: int | None = checked_field(None, at_least(1))
    pr_unfolded_output_projection: bool = False
    pr_centred_sigmoid: bool = True

    def validate_pr_phrase_tokens(self):
        """The fixed segmentation's bounds are in order."""
        if self.pr_min_phrase_tokens > self.pr_max_phrase_tokens:
            raise ValueError(
                f"`pr_min_phrase_tokens` ({self.pr_min_phrase_tokens}) must not exceed `pr_max_phrase_tokens` "
                f"({self.pr_max_phrase_tokens})."
            )


@dataclass
class PhraseSegmentation:
    """
    A batch of source sentences cut into phrases (any token → phrase map: phrases need not be contiguous). P is the
    padded number of phrases and M the padded phrase size: the largest in the batch, or under `torch.compile` bounds
    that follow from the batch's shape ([`segment_phrases`]).

    Attributes:
        mask (`torch.BoolTensor` of shape `(batch_size, P)`):
            `True` for real phrases, `False` for the padded phrases of sentences with fewer than P.
        membership (`torch.Tensor` of shape `(batch_size, P, seq_len)`):
            1 where the token belongs to the phrase, 0 elsewhere.
        mean_weights (`torch.Tensor` of shape `(batch_size, P, seq_len)`):
            1 / phrase size where the token belongs to the phrase, 0 elsewhere.
        logit_bias (`torch.Tensor` of shape `(batch_size, P, seq_len)`):
            0 where the token belongs to the phrase, the dtype's minimum elsewhere (a softmax over it stays inside the
            phrase).
        member_index (`torch.LongTensor` of shape `(batch_size * P * M,)`):
            Row of each phrase's tokens in the (batch_size * seq_len) flattened states; a phrase's unused slots repeat
            its first token (a padded phrase's: the sentence's first token), which leaves a max over them unchanged.
    """

    mask: torch.BoolTensor
    membership: torch.Tensor
    mean_weights: torch.Tensor
    logit_bias: torch.Tensor
    member_index: torch.LongTensor

    @property
    def num_phrases(self) -> int:
        """P, the padded number of phrases per sentence."""
        return self.mask.shape[1]


def fixed_phrase_ids(
    padding_mask: torch.BoolTensor, max_tokens: int = 8, min_tokens: int = 3, length_ratio: int = 6
) -> torch.LongTensor:
    """
    The paper's fixed segmentation (Section 3, footnote 2): phrases of ntok = max(min(8, seql / 6), 3) tokens, the
    last one shorter. seql counts the sentence's tokens before its last real token; that last token (EOS in processor
    output) is a phrase of its own, as in the parse-based `pr_phrase_ids`. Positions are counted over real tokens only,
    so the segmentation of a sentence does not depend on padding (left or right).

    Args:
        padding_mask: (B, L) bool, `True` on real tokens.

    Returns:
        (B, L) phrase index per token, -1 on padding.
    """
    positions = padding_mask.long().cumsum(-1) - 1
    lengths = padding_mask.sum(-1, keepdim=True)
    seq_len = (lengths - 1).clamp(min=0)
    tokens_per_phrase = (seq_len // length_ratio).clamp(min=min_tokens, max=max_tokens)
    phrase_ids = positions // tokens_per_phrase
    eos_phrase = (seq_len + tokens_per_phrase - 1) // tokens_per_phrase
    phrase_ids = torch.where(positions == lengths - 1, eos_phrase, phrase_ids)
    return phrase_ids.masked_fill(~padding_mask, -1)


def segment_phrases(
    phrase_ids: torch.LongTensor,
    dtype: torch.dtype = torch.float32,
    max_phrases: int | None = None,
    max_phrase_size: int | None = None,
) -> PhraseSegmentation:
    """
    (B, L) phrase index per token (-1 = none; a sentence's phrases numbered from 0) → [`PhraseSegmentation`] for
    hidden states of `dtype`. Eagerly P and M are read back from the device, once. Under `torch.compile` they are
    `max_phrases` (at most L) and `max_phrase_size`, by default L, bounds that follow from the batch's shape, so that
    the graph does not depend on the data: the phrases past a sentence's last are empty and masked wherever they are
    read, and a phrase's unused slots repeat its first token, which leaves every real phrase's vector and every
    attention output as they are eagerly.
    """
    batch_size, seq_len = phrase_ids.shape
    device = phrase_ids.device
    sizes = torch.zeros(batch_size, seq_len + 1, dtype=torch.long, device=device)
    # column 0 counts padding; ids past L (refused below) are clamped so that the count stays in range
    sizes.scatter_add_(1, (phrase_ids + 1).clamp(max=seq_len), torch.ones_like(phrase_ids))
    if torch.compiler.is_compiling():
        num_phrases = seq_len if max_phrases is None else max_phrases
        max_size = seq_len if max_phrase_size is None else max_phrase_size
        # checked on the device, without reading the value back into the graph
        torch._assert_async(phrase_ids.max() < num_phrases, "phrase ids must number a sentence's phrases 0, 1, ...")
    else:
        num_phrases, max_size = torch.stack([phrase_ids.max() + 1, sizes[:, 1:].max()]).clamp(min=1).tolist()
        if num_phrases > seq_len:
            raise ValueError(
                f"The phrase ids number {num_phrases} phrases in sequences of {seq_len} tokens: a sentence's phrases "
                "must be numbered 0, 1, ... (`pr_phrase_ids` as the processor makes them)."
            )

    members = phrase_ids.unsqueeze(1) == torch.arange(num_phrases, device=device).unsqueeze(-1)  # (B, P, L)
    sizes = sizes[:, 1 : num_phrases + 1].unsqueeze(-1)
    # member_index: the k-th token of a phrase goes to slot k, non-members to a dropped extra slot M
    slots = members.int().argmax(-1, keepdim=True).repeat(1, 1, max_size + 1)
    rank = (members.cumsum(-1) - 1).masked_fill(~members, max_size)
    slots.scatter_(-1, rank, torch.arange(seq_len, device=device).expand_as(rank))
    offsets = seq_len * torch.arange(batch_size, device=device).view(-1, 1, 1)
    membership = members.to(dtype)
    return PhraseSegmentation(
        mask=sizes.squeeze(-1) > 0,
        membership=membership,
        mean_weights=membership / sizes.clamp(min=1).to(dtype),
        logit_bias=torch.zeros_like(membership).masked_fill(~members, torch.finfo(dtype).min),
        member_index=(slots[..., :max_size] + offsets).flatten(),
    )


@dataclass
class PhraseRepresentationInputs:
    """
    What the PR encoder layers of one forward read, made once from the source syntax ([`from_syntax`]).

    Attributes:
        padding_mask: (B, L), `True` on real tokens.
        segmentation: the source phrases, fixed-size (`pr_segmentation="fixed"`) or from the parse (`"parse"`).
        phrase_attention_mask: the tokens' mask over the phrases for the configured attention backend (for
            (B, 1, L, P)), or None where nothing needs masking.
    """

    padding_mask: torch.BoolTensor
    segmentation: PhraseSegmentation
    phrase_attention_mask: torch.Tensor | None

    @classmethod
    def from_syntax(
        cls, config, syntax: MgsaSyntaxInputs, hidden_states: torch.Tensor
    ) -> "PhraseRepresentationInputs":
        """The segmentation and phrase mask for the encoder's hidden states (B, L, D) (their dtype and device)."""
        seq_len = syntax.padding_mask.shape[1]
        if config.pr_segmentation == "parse":
            needed_by = 'encoder_type="phrase_representation" with pr_segmentation="parse"'
            syntax.require("pr_phrase_ids", needed_by=needed_by)
            phrase_ids = syntax.pr_phrase_ids.long().masked_fill(~syntax.padding_mask, -1)
            max_phrases = max_phrase_size = seq_len
        else:
            phrase_ids = fixed_phrase_ids(
                syntax.padding_mask, config.pr_max_phrase_tokens, config.pr_min_phrase_tokens, config.pr_length_ratio
            )
            # at most ceil((L - 1) / ntok_min) phrases before the EOS, and the EOS's own; none longer than ntok_max
            max_phrases = (seq_len + config.pr_min_phrase_tokens - 2) // config.pr_min_phrase_tokens + 1
            max_phrase_size = config.pr_max_phrase_tokens
        segmentation = segment_phrases(phrase_ids, hidden_states.dtype, max_phrases, max_phrase_size)
        phrase_attention_mask = create_bidirectional_mask(
            config=config,
            inputs_embeds=hidden_states,
            attention_mask=segmentation.mask,
            # the mask reads only the keys' shape (B, P, ·) and dtype; a phrase has a token, so P <= L
            encoder_hidden_states=hidden_states[:, : segmentation.num_phrases],
        )
        return cls(syntax.padding_mask, segmentation, phrase_attention_mask)


class AttentivePhrasePooling(nn.Module):
    """
    Phrase vectors from token vectors (Section 3.1). The glance F_glance (Eq. 2) is max-over-time or mean pooling
    inside the phrase; with `pr_attentive` each token is scored against it, s_i = W2 σ(W1 [R_ti | R_all] + b1) (Eq. 3),
    the scores are normalised inside the phrase (Eq. 4) and the phrase is the weighted sum of its tokens (Eq. 5);
    otherwise the glance is the phrase vector (the "+Mean" / "+Max" rows of Table 2). W1 maps the 2D concatenation to
    `pr_pooling_dim` units (12 D by default: the width at which Table 2's "+Max+Attn" count comes out at
    Transformer-base). Eq. 3's output bias b2 is left out: a softmax inside the phrase is invariant to it. Padded
    phrases get finite values that every attention masks.
    """

    def __init__(self, config):
        super().__init__()
        self.embed_dim = config.d_model
        self.glance = config.pr_glance
        self.attentive = config.pr_attentive
        if self.attentive:
            hidden_dim = config.pr_pooling_dim or 12 * self.embed_dim
            # W1 [R_ti | R_all] + b1 as W1_token R_ti + (W1_glance R_all + b1): the glance half once per phrase
            self.score_token = nn.Linear(self.embed_dim, hidden_dim, bias=False)
            self.score_glance = nn.Linear(self.embed_dim, hidden_dim)
            self.score_out = nn.Linear(hidden_dim, 1, bias=False)  # W2

    def forward(self, hidden_states: torch.Tensor, segmentation: PhraseSegmentation) -> torch.Tensor:
        """hidden_states (B, L, D) → phrase vectors (B, P, D)."""
        if self.glance == "max":  # Eq. 2, max-over-time over each phrase's (B, P, M) token slots
            batch_size, _, embed_dim = hidden_states.shape
            members = hidden_states.reshape(-1, embed_dim).index_select(0, segmentation.member_index)
            glance = members.view(batch_size, segmentation.num_phrases, -1, embed_dim).max(dim=2).values
        else:  # Eq. 2, mean
            glance = torch.bmm(segmentation.mean_weights, hidden_states)
        if not self.attentive:
            return glance

        # Eq. 3; each phrase's glance features are sent to its tokens with the (B, L, P) membership
        glance_features = torch.bmm(segmentation.membership.transpose(1, 2), self.score_glance(glance))
        scores = self.score_out(torch.sigmoid(self.score_token(hidden_states) + glance_features)).transpose(1, 2)
        weights = torch.softmax(scores + segmentation.logit_bias, dim=-1)  # Eq. 4, (B, 1, L) + (B, P, L)
        return torch.bmm(weights, hidden_states)  # Eq. 5


class PhraseAttention(MgsaAttention):
    """The tokens' multi-head attention over their sentence's phrases (Eq. 7), fewer keys than queries. Backends:
    `eager` and `sdpa`; flex attention's kernel gave NaN here on CPU (torch 2.13), so it raises instead of returning
    wrong tensors."""

    supported_attn_implementations = ("eager", "sdpa")


class AttentivePhraseCombination(nn.Module):
    """
    The attentive combination network (Section 3.2): multi-head cross-attention from the tokens (queries) to the
    phrases (keys and values), out_phrase = Attn_MH(x, R_phrase) (Eq. 7), then
    out = W4 σ(W3 [x | out_phrase] + b3) + b4 (Eq. 8). The residual connection and LayerNorm around it belong to the
    layer.

    W3 [x | out_phrase] = W3_x x + W3_p W_O context: the attention's output projection W_O and the half of W3 that
    reads its output are two linear maps in a row, so they are learnt as their product, the attention's output
    projection (`attn.out_proj` holding W3_p W_O and b3 on Marian; `attn.o` on T5, whose projections have no bias, so
    b3 sits in `combine_token`; D → `pr_combination_dim`). The layer computes the same family of functions with one
    D×D product per token less. `pr_unfolded_output_projection=True` keeps them apart as Eqs. 7-8 print them: the
    attention's W_O (D → D, its bias on Marian) then `combine_phrase`, W3_p (D → `pr_combination_dim`), with b3 in
    `combine_token`.

    The sigmoid's output is centred: out = W4 (σ(h) − ½) + b4, which is Eq. 8 with b4 standing for b4 + ½ W4 1 (the
    same family of functions, the same parameters). A sigmoid's outputs are all positive, so with Eq. 8 as written
    every gradient step moves the row sums of W4 together and Adam grows W4 ½·1, a vector added to every token, fast:
    at the CPU recipe (128d, lr 0.005) the encoder's combination output reached its input's RMS by step 100 and 3.7
    times it by step 300, post-LN shrank the tokens' own part, and the training loss at step 300 was 4.36 against the
    transformer's 3.92; centred, the output stays at 0.14-0.20 of its input and the loss at 3.95
    (`scripts/probe_sublayers.py`, `benchmarks/sublayer-probe-cpu.json`). `pr_centred_sigmoid=False` computes Eq. 8 as
    written.
    """

    def __init__(self, config, num_heads: int, is_decoder: bool = False, layer_idx: int | None = None):
        super().__init__()
        embed_dim = config.d_model
        hidden_dim = config.pr_combination_dim or 3 * embed_dim
        unfolded = config.pr_unfolded_output_projection
        # a key bias adds the same logit to every phrase of a query, which the softmax ignores
        self.attn = PhraseAttention(
            config, num_heads, is_decoder=is_decoder, layer_idx=layer_idx, key_bias=False,
            output_dim=embed_dim if unfolded else hidden_dim,
        )
        # W3_p of Eq. 8 on Eq. 7's out_phrase, apart from W_O when unfolded (else folded into the output projection)
        self.combine_phrase = nn.Linear(embed_dim, hidden_dim, bias=False) if unfolded else None
        has_b3 = unfolded or self.attn.output_proj.bias is None
        self.combine_token = nn.Linear(embed_dim, hidden_dim, bias=has_b3)  # W3_x (b3)
        self.combine_out = nn.Linear(hidden_dim, embed_dim)  # W4, b4
        self.sigmoid_offset = 0.5 if config.pr_centred_sigmoid else 0.0

    @torch.no_grad()
    def init_as_identity(self) -> bool:
        """
        Start the combination at 0 (W4 = 0 and b4 = 0 in Eq. 8, with `pr_centred_sigmoid` the whole output; W4 trains
        from the first step, W3 and the attention from the second), so that the sub-layer around it adds nothing to
        the residual stream of the checkpoint it upgrades (`load_as_mgsa`). On a pre-norm backbone (T5) the layer then
        computes what it computed before; on post-LN Marian the sub-layer still ends in a LayerNorm of its own,
        which normalises every token once more.

        Returns:
            True: the combination's output is exactly 0, centred sigmoid or not.
        """
        self.combine_out.weight.zero_()
        self.combine_out.bias.zero_()
        return True

    def forward(
        self,
        hidden_states: torch.Tensor,
        phrase_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        """hidden_states (B, T, D), phrase_states (B, P, D), attention_mask for (B, 1, T, P) → (B, T, D)."""
        # W3_p out_phrase + b3 (Eq. 7 with W3_p folded into the output projection)
        phrase_part, _, _ = self.attn(
            hidden_states,
            key_value_states=phrase_states,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
        )
        if self.combine_phrase is not None:  # W3_p (W_O context + b_O), Eqs. 7-8 as printed
            phrase_part = self.combine_phrase(phrase_part)
        # Eq. 8, the sigmoid centred by default (see the class docstring): W4 (σ(h) − ½) + b4 computed as
        # W4 σ(h) + (b4 − ½ W4 1), the same function and gradients without a second (B, T, 3D) activation to keep
        activation = torch.sigmoid(self.combine_token(hidden_states) + phrase_part)
        bias = self.combine_out.bias
        if self.sigmoid_offset:
            bias = bias - self.sigmoid_offset * self.combine_out.weight.sum(dim=-1)
        return nn.functional.linear(activation, self.combine_out.weight, bias)


class PhraseRepresentationEncoderMixin:
    """
    PR encoder layer (Figure 2), mixed into a backbone's encoder layer: phrases pooled from the layer input
    (Eq. 2-5) → attentive combination with them (Eq. 7-8, wrapped as the backbone wraps a sub-layer: residual and
    post-LN on Marian, pre-RMSNorm and residual on T5) → the backbone's self-attention → feed-forward.

    Each layer returns its input's phrases in its [`MgsaLayerOutput`] (level k for layer k, level 0 being the
    embeddings); the last layer also pools its output (level d), so the encoder gathers the d + 1 levels that
    Transparent Attention mixes (Eq. 6, "0 corresponds to the embedding layer"; footnote 4's 7 × 6 weights for 6
    encoder layers). On a pre-norm backbone the phrases are pooled from normalised states: the sub-layer's norm for
    the input, an own norm (`output_phrase_layer_norm`) for the last layer's output.
    """

    def __init__(self, config, self_attn: MgsaAttention, layer_idx: int):
        super().__init__(config, self_attn, layer_idx)
        self.config = config
        self.phrase_pooling = AttentivePhrasePooling(config)
        self.phrase_combination = AttentivePhraseCombination(
            config, config.encoder_attention_heads, layer_idx=layer_idx
        )
        self.phrase_combination_layer_norm = self.make_layer_norm()
        self.is_last = layer_idx == config.encoder_layers - 1
        self.output_phrase_pooling = AttentivePhrasePooling(config) if self.is_last else None
        self.output_phrase_layer_norm = self.make_output_layer_norm() if self.is_last else None

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        syntax: PhraseRepresentationInputs | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, MgsaLayerOutput]:
        """
        Args:
            hidden_states: (B, L, D); attention_mask: additive (B, 1, L, L) or None.
            syntax: the batch's [`PhraseRepresentationInputs`] (the encoder makes them once per forward).

        Returns:
            `(hidden_states (B, L, D), MgsaLayerOutput with this layer's phrase_states and the phrase_mask, *what the
            backbone's layer returns after its contribution)` (T5: the position bias it passes on).
        """
        require_inputs(syntax, PhraseRepresentationInputs, self)
        segmentation = syntax.segmentation
        phrase_states = []

        def combine_with_phrases(states: torch.Tensor) -> torch.Tensor:
            phrase_states.append(self.phrase_pooling(states, segmentation))
            return self.phrase_combination(states, phrase_states[-1], syntax.phrase_attention_mask)

        hidden_states = self.sublayer(hidden_states, combine_with_phrases, self.phrase_combination_layer_norm)
        hidden_states, _, *passed_on = super().forward(hidden_states, attention_mask, syntax=syntax, **kwargs)
        if self.is_last:
            states = hidden_states if self.output_phrase_layer_norm is None else self.output_phrase_layer_norm(
                hidden_states
            )
            phrase_states.append(self.output_phrase_pooling(states, segmentation))
        contribution = MgsaLayerOutput(phrase_states=tuple(phrase_states), phrase_mask=segmentation.mask)
        return hidden_states, contribution, *passed_on

    def init_as_identity(self) -> bool:
        """Start the phrase sub-layer at 0 ([`AttentivePhraseCombination.init_as_identity`]); whether the layer then
        computes what the plain layer computed: on a pre-norm backbone yes, on post-LN the sub-layer's LayerNorm
        remains."""
        self.phrase_combination.init_as_identity()
        return self.pre_norm


class TransparentAttention(nn.Module):
    """
    Transparent Attention over encoder levels (Eq. 6): R_dphrase^j = Σ_i softmax(w^j)_i R_ephrase^i for i = 0..d.
    The weights start equal (w = 0).
    """

    def __init__(self, config):
        super().__init__()
        self.level_weights = nn.Parameter(torch.zeros(config.encoder_layers + 1))

    def init_variant_parameters(self, config):
        """The level weights w start at 0: an equal mix of the d + 1 encoder levels."""
        init.zeros_(self.level_weights)

    def forward(self, phrase_states: torch.Tensor) -> torch.Tensor:
        """phrase_states (B, d + 1, P, D) → (B, P, D)."""
        if phrase_states.shape[1] != self.level_weights.shape[0]:
            raise ValueError(
                f"Transparent Attention mixes {self.level_weights.shape[0]} encoder levels of phrases but got "
                f"{phrase_states.shape[1]}: every encoder layer must run (set `encoder_layerdrop=0`) and the phrases "
                "must come from an encoder with the same `encoder_layers`."
            )
        weights = torch.softmax(self.level_weights, dim=0).to(phrase_states.dtype)
        mixed = torch.matmul(weights, phrase_states.flatten(2))  # (d + 1) @ (B, d + 1, P * D), without a copy
        return mixed.view(phrase_states.shape[0], *phrase_states.shape[2:])


class PhraseRepresentationDecoderMixin:
    """
    PR decoder layer (Section 3.2), mixed into a backbone's decoder layer: self-attention → attentive combination
    with the source phrases (Eq. 7-8, wrapped as the backbone wraps a sub-layer) → cross-attention to the source
    tokens → feed-forward. The phrases are the Transparent Attention mix
    of all encoder levels (Eq. 6), or the last level's without `pr_transparent_attention`.

    With a cache, the phrase keys and values are computed at the first step and kept in the cross-attention cache under
    layer index `decoder_layers + layer_idx` (after the token cross-attention's), so they are reordered with the beams.
    """

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.config = config
        self.phrase_cache_idx = config.decoder_layers + layer_idx
        self.phrase_combination = AttentivePhraseCombination(
            config, config.decoder_attention_heads, is_decoder=True, layer_idx=self.phrase_cache_idx
        )
        self.phrase_combination_layer_norm = self.make_layer_norm()
        self.transparent_attention = TransparentAttention(config) if config.pr_transparent_attention else None

    def source_phrases(self, encoder_phrase_states: torch.Tensor) -> torch.Tensor:
        """The phrases this layer attends to: (B, d + 1, P, D) → (B, P, D)."""
        if self.transparent_attention is None:
            return encoder_phrase_states[:, -1]
        return self.transparent_attention(encoder_phrase_states)

    def phrase_cache(self, past_key_values: Cache | None) -> Cache | None:
        """The cache holding this layer's phrase keys/values, with its slot made; None (recompute) for other caches."""
        if not isinstance(past_key_values, EncoderDecoderCache):
            return None
        cross_cache = past_key_values.cross_attention_cache
        if not isinstance(cross_cache, DynamicCache):
            return None
        while len(cross_cache.layers) <= self.phrase_cache_idx:
            cross_cache.layers.append(DynamicLayer())
        return past_key_values

    def cross_attention(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None,
        past_key_values: Cache | None,
        encoder_phrase_states: torch.Tensor | None = None,
        encoder_phrase_mask: torch.BoolTensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """
        Args:
            encoder_phrase_states: (B, d + 1, P, D) phrases of every encoder level; encoder_phrase_mask: (B, P) bool.
        """
        if encoder_phrase_states is None or encoder_phrase_mask is None:
            raise ValueError(
                'The encoder_type="phrase_representation" decoder needs `encoder_phrase_states` and '
                "`encoder_phrase_mask`: pass `encoder_outputs` as returned by the PR encoder (an `MgsaEncoderOutput` "
                "with `phrase_states`)."
            )
        phrase_cache = self.phrase_cache(past_key_values)
        if phrase_cache is not None and phrase_cache.is_updated.get(self.phrase_cache_idx):
            # the phrase keys and values are cached: attention and mask only read the phrases' shape
            phrase_states = encoder_phrase_states[:, -1]
        else:
            phrase_states = self.source_phrases(encoder_phrase_states)
        phrase_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_phrase_mask,
            encoder_hidden_states=phrase_states,
        )
        hidden_states = self.sublayer(
            hidden_states,
            lambda states: self.phrase_combination(
                states, phrase_states, phrase_attention_mask, past_key_values=phrase_cache
            ),
            self.phrase_combination_layer_norm,
        )
        return super().cross_attention(hidden_states, encoder_hidden_states, encoder_attention_mask, past_key_values)

    def init_as_identity(self) -> bool:
        """Start the phrase sub-layer at 0 ([`AttentivePhraseCombination.init_as_identity`]); whether the layer then
        computes what the plain layer computed: on a pre-norm backbone yes, on post-LN the sub-layer's LayerNorm
        remains."""
        self.phrase_combination.init_as_identity()
        return self.pre_norm


def phrase_representation_syntax_fields(config) -> tuple[str, ...]:
    """The source syntax PR reads: Algorithm 1's `pr_phrase_ids` with the parse segmentation (the fixed one is made in
    the model)."""
    return ("pr_phrase_ids",) if config.pr_segmentation == "parse" else ()


PHRASE_REPRESENTATION = Variant(
    name="phrase_representation",
    summary="source phrase representations attended by every encoder and decoder layer, with transparent attention.",
    paper="Learning Source Phrase Representations for Neural Machine Translation",
    paper_url="https://aclanthology.org/2020.acl-main.37",
    config_fields=PhraseRepresentationConfigFields,
    field_prefixes=("pr_",),
    encoder_layer_mixin=PhraseRepresentationEncoderMixin,
    decoder_layer_mixin=PhraseRepresentationDecoderMixin,
    inputs=PhraseRepresentationInputs,
    syntax_fields=phrase_representation_syntax_fields,
    output_fields=("phrase_states", "phrase_mask"),
    # a config saved before these fields existed was built with W1 d_model wide and Eq. 8 uncentred
    legacy_values={"pr_pooling_dim": lambda saved: saved.get("d_model"), "pr_centred_sigmoid": False},
)
