"""The RHE variant (`encoder_type="rhe"`): redundant-head enlivening, from "Enlivening Redundant Heads in Multi-head
Self-attention for Machine Translation" (Zhang et al., EMNLP 2021). Its configuration fields, the dependency- and
local-phrase-enhanced attentions (DEA, LPEA) with the per-sentence identification of redundant heads, and its
[`Variant`] (`RHE`); the redundant-head rate over a data set is in `mgsa_hf.evaluation.analysis`."""

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from transformers import initialization as init
from transformers.utils import logging

from .configuration_fields import at_least, checked_field, in_unit_interval, items_at_least
from .modeling_attention import MgsaAttention
from .modeling_outputs_mgsa import MgsaLayerOutput
from .modeling_syntax_inputs import MgsaSyntaxInputs, require_inputs
from .modeling_variant import Variant


logger = logging.get_logger(__name__)


@dataclass(kw_only=True, repr=False)
class RheConfigFields:
    r"""
        rhe_layers (`list[int]`, *optional*, defaults to `[0]`):
            RHE: encoder layers with syntax-enhanced attention.
        rhe_attention (`str`, defaults to `"lpea"`):
            RHE: the syntax-enhanced attention, `"dea"` (dependency mask) or `"lpea"` (local-phrase bias).
        rhe_mode (`str`, defaults to `"rhe"`):
            RHE: `"sea_all"` (every head uses the syntax-enhanced attention), `"rhe"` (redundant heads do) or
            `"rhe_prune"` (redundant heads are zeroed).
        rhe_max_relative_position (`int`, defaults to 6):
            RHE: clipping distance k of relative local-phrasal positions.
        rhe_out_of_phrase (`str`, defaults to `"clip"`):
            RHE LPEA: word pairs outside one local phrase have relative position ∞, which Eq. 7's clip turns into k,
            so they attend with the learned w_k (`"clip"`, the paper's); `"mask"` drops those pairs instead.
        rhe_gate (`str`, defaults to `"confidence"`):
            RHE: the Syn_gate a head's Syn_attn must exceed to count as important: `"confidence"` (h_conf, the
            criterion the paper's prose states beside Eq. 10), `"sigmoid"` (σ(h_conf), Eq. 10 as printed: σ(h_conf)
            > 0.5, so a trained CPU-recipe model labels 100% of its heads redundant and RHE acts as SEA on every
            head) or `"learned"` (σ(w_h h_conf + b_h), w and b trained per head through a straight-through
            estimator). `rows/rhe/README.md` gives the share of heads each labels redundant, before and after
            training. A saved config without the field (trained before it existed) loads with `"sigmoid"`.
        rhe_fixed_gate (`float`, *optional*):
            RHE: a fixed Syn_gate instead of `rhe_gate`'s (not with `"learned"`).
    """

    rhe_layers: list[int] | None = checked_field(None, items_at_least(0, non_empty=False))
    rhe_attention: Literal["dea", "lpea"] = "lpea"
    rhe_mode: Literal["rhe", "sea_all", "rhe_prune"] = "rhe"
    rhe_max_relative_position: int = checked_field(6, at_least(0))
    rhe_out_of_phrase: Literal["clip", "mask"] = "clip"
    rhe_fixed_gate: float | int | None = checked_field(None, in_unit_interval)
    rhe_gate: Literal["sigmoid", "confidence", "learned"] = "confidence"

    def validate_rhe_gate(self):
        """A fixed gate is not learned."""
        if self.rhe_fixed_gate is not None and self.rhe_gate == "learned":
            raise ValueError('`rhe_fixed_gate` fixes the gate that `rhe_gate="learned"` learns: set one of the two.')


def dependency_relation(syntax: MgsaSyntaxInputs) -> torch.BoolTensor:
    """
    Dep(x_i, x_j) at subword level, (B, L, L): tokens of one word, or one token's word is the other's dependency head.
    Padding (word id -1) relates to nothing; EOS is its own word and its own head, so it relates to itself only.
    """
    words, heads = syntax.word_ids, syntax.head_word_ids
    related = (
        (words[:, :, None] == words[:, None, :])
        | (heads[:, :, None] == words[:, None, :])
        | (words[:, :, None] == heads[:, None, :])
    )
    real = (words >= 0) & syntax.padding_mask
    return related & real[:, :, None] & real[:, None, :]


def local_phrase_relation(syntax: MgsaSyntaxInputs) -> torch.BoolTensor:
    """(B, L, L): j lies in i's local phrase (Rule 1) or i in j's (Rule 2)."""
    positions = torch.arange(syntax.padding_mask.shape[-1], device=syntax.padding_mask.device)
    start, end = syntax.local_phrase_start[:, :, None], syntax.local_phrase_end[:, :, None]
    in_phrase = (positions >= start) & (positions < end)
    real = syntax.padding_mask
    return (in_phrase | in_phrase.transpose(1, 2)) & real[:, :, None] & real[:, None, :]


def relative_phrasal_labels(syntax: MgsaSyntaxInputs, max_relative_position: int) -> torch.LongTensor:
    """Edge labels clip(RP_ij, k) + k in [0, 2k] (Eq. 7), with RP_ij = depth(x_j) - depth(x_i); (B, L, L)."""
    depth = syntax.tree_depth
    relative = depth[:, None, :] - depth[:, :, None]
    return relative.clamp(-max_relative_position, max_relative_position) + max_relative_position


def sea_allowed(syntax: MgsaSyntaxInputs, relation: torch.BoolTensor) -> torch.BoolTensor:
    """
    Pairs the syntax-enhanced attention keeps, (B, L, L): the relation and the diagonal, on real keys. Padding
    queries keep every real key, as in plain attention, so that no row is empty.
    """
    real = syntax.padding_mask
    diagonal = torch.eye(real.shape[-1], dtype=torch.bool, device=real.device)
    return (relation | diagonal | ~real[:, :, None]) & real[:, None, :]


def required_syntax_fields(config) -> tuple[str, ...]:
    """The syntax fields RHE layers read: dependencies for DEA and for head identification, the local phrases and
    tree depths for LPEA (unless its heads are only pruned)."""
    fields = ("word_ids", "head_word_ids") if config.rhe_mode != "sea_all" or config.rhe_attention == "dea" else ()
    if config.rhe_attention == "lpea" and config.rhe_mode != "rhe_prune":
        fields += ("local_phrase_start", "local_phrase_end", "tree_depth")
    return fields


def check_syntax_ranges(syntax: MgsaSyntaxInputs, fields: tuple[str, ...]) -> None:
    """
    Refuse syntax fields the processor never makes, which would silently change the related pairs or the phrasal
    labels: on the real tokens of a sentence, a `head_word_ids` that names no word of it (below 0 or past its last word
    id, EOS's), a local phrase (`local_phrase_start` <= position < `local_phrase_end`) that does not hold its token or
    ends past the sentence, a negative `tree_depth`. Under `torch.compile` the checks run on the device, without a
    graph break. (A truncated sentence's EOS keeps a word id past the sequence, so `word_ids` has no upper bound.)
    """
    real = syntax.padding_mask
    positions = torch.arange(real.shape[-1], device=real.device)
    wrong_values = {}
    if "head_word_ids" in fields:
        words, heads = syntax.word_ids, syntax.head_word_ids
        last_word = words.masked_fill(~real, -1).amax(-1, keepdim=True)  # EOS's word id
        wrong_values["head_word_ids"] = real & (words >= 0) & ((heads < 0) | (heads > last_word))
    if "local_phrase_start" in fields:
        sentence_end = (real * (positions + 1)).amax(-1, keepdim=True)  # one past the last real token
        start, end = syntax.local_phrase_start, syntax.local_phrase_end
        wrong_values["local_phrase_start"] = real & ((start < 0) | (start > positions))
        wrong_values["local_phrase_end"] = real & ((end <= positions) | (end > sentence_end))
        wrong_values["tree_depth"] = real & (syntax.tree_depth < 0)
    for name, wrong in wrong_values.items():
        message = f"`{name}` holds a value the processor never makes (`mgsa_hf.syntax_fields` says which)"
        if torch.compiler.is_compiling():
            torch._assert_async(~wrong.any(), message)
        elif wrong.any():
            sentence, position = (int(index) for index in wrong.nonzero()[0])
            value = int(getattr(syntax, name)[sentence, position])
            raise ValueError(
                f"{message}: {name}={value} at token {position} of sentence {sentence}, which has "
                f"{int(real[sentence].sum())} tokens. Pass the processor's output."
            )


@dataclass
class RheInputs:
    """
    What the RHE layers of one forward read, made once from the source syntax ([`from_syntax`]).

    Attributes:
        padding_mask: (B, L), `True` on real tokens.
        dependency: (B, L, L) Dep_mask (for DEA and head identification), or None when no layer reads it.
        sea_allowed: (B, L, L) or (B, 1, L) the key pairs the syntax-enhanced attention keeps, or None (`"rhe_prune"`).
        phrasal_labels: (B, L, L) LPEA's relative local-phrasal labels in [0, 2k] (Eq. 7), or None for DEA.
    """

    padding_mask: torch.BoolTensor
    dependency: torch.BoolTensor | None = None
    sea_allowed: torch.BoolTensor | None = None
    phrasal_labels: torch.LongTensor | None = None

    @classmethod
    def from_syntax(cls, config, syntax: MgsaSyntaxInputs, hidden_states: torch.Tensor | None = None) -> "RheInputs":
        """What the configured RHE layers read, from a batch's [`MgsaSyntaxInputs`] (its needed fields required and
        their ranges checked): Dep_mask, the key pairs SEA keeps (Eq. 5's D for DEA, the local phrases for LPEA) and
        LPEA's labels (Eq. 7); `rhe_prune` needs Dep_mask only. `hidden_states` is not read."""
        fields = required_syntax_fields(config)
        syntax.require(*fields, needed_by=f'encoder_type="rhe" ({config.rhe_attention})')
        check_syntax_ranges(syntax, fields)
        dependency = dependency_relation(syntax) if "word_ids" in fields else None
        inputs = cls(padding_mask=syntax.padding_mask, dependency=dependency)
        if config.rhe_mode == "rhe_prune":
            return inputs
        if config.rhe_attention == "dea":  # Eq. 5's D: the dependency-related pairs
            inputs.sea_allowed = sea_allowed(syntax, dependency)
            return inputs
        k = config.rhe_max_relative_position
        allowed = sea_allowed(syntax, local_phrase_relation(syntax))
        labels = relative_phrasal_labels(syntax, k)
        if config.rhe_out_of_phrase == "clip":
            # Eq. 7: out of one local phrase RP_ij = ∞, clipped to k (label 2k); only padding keys are dropped
            labels = labels.masked_fill(~allowed, 2 * k)
            allowed = syntax.padding_mask[:, None, :]
        inputs.sea_allowed, inputs.phrasal_labels = allowed, labels
        return inputs


class RheAttention(MgsaAttention):
    """
    Multi-head self-attention whose redundant heads are replaced by a syntax-enhanced attention (SEA).

    SEA (`rhe_attention`): softmax(ξ_ij + bias_ij) with ξ = QKᵀ / √d_h and
    - `"dea"`: bias = D_ij = 0 on the diagonal and dependency-related pairs, -∞ elsewhere (Eqs. 4-5);
    - `"lpea"`: bias = P_ij = -|tanh(W_P M_ij + b_P) U_P| (Eq. 8), where M_ij is the learned vector w of the clipped
      relative local-phrasal position (Eq. 7). Pairs outside one local phrase have position ∞, clipped to k
      (`rhe_out_of_phrase="clip"`, the paper's), or are dropped (`"mask"`). P depends on the label only, so the
      2k + 1 values are computed once per forward and gathered into (B, L, L).

    Redundant-head identification, per sentence and head, from the plain attention A (Eqs. 3, 9, 10):
    h_conf = mean_i max_j A_ij, Syn_attn = mean_i Σ_j Dep_ij A_ij; the head is important iff Syn_attn > Syn_gate,
    with Syn_gate (`rhe_gate`) σ(h_conf) as Eq. 10 prints it (`"sigmoid"`), h_conf as the paragraph before it says
    (`"confidence"`), σ(w_h h_conf + b_h) with a learned w, b per head (`"learned"`) or `rhe_fixed_gate`. The
    learned gate receives its gradient through the hard label by a straight-through estimator: the forward uses the
    label, the backward that of the soft label σ((Syn_attn - Syn_gate) / `gate_temperature`), so w, b move the
    threshold towards the distribution (plain or SEA) the loss prefers. `rhe_mode`: `"rhe"` gives redundant heads
    the SEA distribution,
    `"rhe_prune"` drops them (their context is not computed), `"sea_all"` uses SEA on every head (no
    identification). The labels, (B, H) long with 1 = important, are returned in the layer's [`MgsaLayerOutput`] in
    the `"rhe"` and `"rhe_prune"` modes.

    Backends: the identification needs every head's full distribution A, so the layer computes its attention
    explicitly whatever `attn_implementation` says (the model's other layers use the configured kernel); it returns
    those weights under eager only, as every layer does, so `output_attentions` has MarianMTModel's entries.
    """

    def __init__(self, config, num_heads: int, is_decoder: bool = False, is_causal: bool = False, layer_idx=None,
                 **kwargs):
        super().__init__(config, num_heads, is_decoder=is_decoder, is_causal=is_causal, layer_idx=layer_idx, **kwargs)
        self.syntax_attention = config.rhe_attention
        self.mode = config.rhe_mode
        self.max_relative_position = config.rhe_max_relative_position
        self.fixed_gate = config.rhe_fixed_gate
        self.gate = config.rhe_gate
        self.uses_phrases = self.syntax_attention == "lpea" and self.mode != "rhe_prune"
        if self.gate == "learned" and self.mode != "sea_all":
            # Syn_gate = σ(w_h h_conf + b_h), starting as Eq. 10's σ(h_conf)
            self.gate_weight = nn.Parameter(torch.ones(num_heads))
            self.gate_bias = nn.Parameter(torch.zeros(num_heads))
        if self.uses_phrases:
            # w = (w_-k, ..., w_k), W_P and b_P, U_P of Eq. 8
            self.relative_embeddings = nn.Embedding(2 * self.max_relative_position + 1, self.head_dim)
            self.relative_proj = nn.Linear(self.head_dim, self.head_dim)
            self.relative_score = nn.Linear(self.head_dim, 1, bias=False)

    # the scale of U_P when a converted checkpoint's layer starts as its plain attention (|P| about 1e-4)
    identity_score_std = 1e-4
    # temperature of the soft label whose gradient the learned gate receives (Syn_attn and Syn_gate lie in [0, 1])
    gate_temperature = 0.05

    def init_variant_parameters(self, config):
        """The learned gate starts as Eq. 10's σ(h_conf) (w = 1, b = 0)."""
        if hasattr(self, "gate_weight"):
            init.ones_(self.gate_weight)
            init.zeros_(self.gate_bias)

    @torch.no_grad()
    def init_as_identity(self) -> bool:
        """
        Start this layer close to the plain self-attention of the checkpoint it upgrades (`load_as_mgsa`). LPEA with
        pairs out of one local phrase clipped (the defaults): U_P of Eq. 8 drawn at std 1e-4, so P, the only thing SEA
        adds to the energy, is about 1e-4 and every head, redundant or not, attends as before. U_P = 0 would give
        exactly the plain attention, but |·|'s gradient at 0 is 0, so P would never train. DEA (-∞ off the
        dependencies), masked out-of-phrase pairs and pruned heads change the attention by construction.

        Returns:
            False: no setting makes SEA exactly the plain attention while it can still learn.
        """
        if self.uses_phrases and self.config.rhe_out_of_phrase == "clip" and self.mode != "rhe_prune":
            self.relative_score.weight.normal_(0.0, self.identity_score_std)
        return False

    def relative_phrasal_bias(self) -> torch.Tensor:
        """P for the 2k + 1 labels (Eq. 8): -|tanh(W_P w + b_P) U_P|, shape (2k + 1,)."""
        hidden = torch.tanh(self.relative_proj(self.relative_embeddings.weight))
        return -self.relative_score(hidden).squeeze(-1).abs()

    def syntax_bias(self, syntax: RheInputs, dtype: torch.dtype) -> torch.Tensor:
        """The SEA bias (B, 1, L, L): D of Eq. 5 or P of Eq. 8, with the dtype's minimum on dropped pairs."""
        if self.syntax_attention == "dea":
            bias = torch.zeros(syntax.sea_allowed.shape, dtype=dtype, device=syntax.sea_allowed.device)
        else:
            bias = self.relative_phrasal_bias().to(dtype)[syntax.phrasal_labels]  # by label, never (B, L, L, d_h)
        return bias.masked_fill(~syntax.sea_allowed, torch.finfo(dtype).min).unsqueeze(1)

    def identify_important_heads(
        self, weights: torch.Tensor, dependency: torch.BoolTensor, padding_mask: torch.BoolTensor
    ) -> tuple[torch.BoolTensor, torch.Tensor | None]:
        """
        Eqs. 3, 9, 10 on the plain attention `weights` (B, H, L, L), averaging over the real queries of each sentence.
        h_conf and Syn_attn are measurements of the attention: no gradient flows through them.

        Args:
            dependency: (B, L, L) Dep_mask; padding_mask: (B, L), `True` on real tokens.

        Returns:
            `(important, straight_through)`: `important` (B, H) `True` for important heads (Syn_attn > Syn_gate);
            `straight_through` (B, H), with the learned gate in training, is 0 in value and carries the soft label's
            gradient to w, b (add it to the hard label), else None.
        """
        with torch.no_grad():
            queries = padding_mask[:, None, :].to(weights.dtype)  # (B, 1, L)
            num_queries = queries.sum(-1).clamp(min=1)
            h_conf = (weights.amax(-1) * queries).sum(-1) / num_queries  # Eq. 3
            syn_attn = (weights.masked_fill(~dependency[:, None], 0).sum(-1) * queries).sum(-1) / num_queries  # Eq. 9
        if self.fixed_gate is not None:
            syn_gate = self.fixed_gate
        elif self.gate == "confidence":  # the prose before Eq. 10: important when Syn_attn exceeds h_conf
            syn_gate = h_conf
        elif self.gate == "learned":
            syn_gate = torch.sigmoid(self.gate_weight.to(h_conf.dtype) * h_conf + self.gate_bias.to(h_conf.dtype))
        else:  # Eq. 10 as printed: Syn_gate = sigmoid(h_conf)
            syn_gate = torch.sigmoid(h_conf)
        important = syn_attn > syn_gate  # Eq. 10 (a comparison: no gradient)
        if self.gate != "learned" or self.fixed_gate is not None or not torch.is_grad_enabled():
            return important, None
        soft = torch.sigmoid((syn_attn - syn_gate) / self.gate_temperature)
        return important, soft - soft.detach()

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        syntax: RheInputs | None = None,
        position_bias: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None, MgsaLayerOutput]:
        """
        Encoder self-attention. `hidden_states` (B, L, D); `syntax` the batch's [`RheInputs`] (the encoder makes them
        once per forward). `attention_mask` is not read: padding comes from `syntax.padding_mask`. T5's
        `position_bias` (1, H, L, L) is part of the energy ξ, so both the plain and the SEA distributions carry it.

        Returns:
            `(output (B, L, D), attention weights (B, H, L, L) after head replacement, before dropout,
            MgsaLayerOutput with the head labels (B, H) or None for "sea_all")`. The weights are None unless the
            backend is eager (or a bare layer's config names none), as every other layer on a fused kernel returns
            them, so `output_attentions` is MarianMTModel's: one entry per layer, or none under sdpa and flex.
        """
        output, weights, contribution = self.syntax_enhanced_attention(
            hidden_states, key_value_states, past_key_values, syntax, position_bias
        )
        return output, weights if self.config._attn_implementation in (None, "eager") else None, contribution

    def syntax_enhanced_attention(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None,
        past_key_values,
        syntax: RheInputs | None,
        position_bias: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, MgsaLayerOutput]:
        """[`forward`] with the explicit weights always returned."""
        if key_value_states is not None or past_key_values is not None:
            raise ValueError("RheAttention is an encoder self-attention: it takes no key_value_states or cache.")
        require_inputs(syntax, RheInputs, self)
        query = self.split_heads(self.query_proj(hidden_states))
        key = self.split_heads(self.key_proj(hidden_states))
        value = self.split_heads(self.value_proj(hidden_states))

        energy = self.energy(query, key, position_bias)  # (B, H, L, L)
        if self.mode == "sea_all":
            weights = nn.functional.softmax(energy + self.syntax_bias(syntax, energy.dtype), dim=-1)
            return self.merge_heads(torch.matmul(self.attention_dropout(weights), value)), weights, MgsaLayerOutput()

        padding = ~syntax.padding_mask[:, None, None, :]
        weights = nn.functional.softmax(energy.masked_fill(padding, torch.finfo(energy.dtype).min), dim=-1)
        important, straight_through = self.identify_important_heads(weights, syntax.dependency, syntax.padding_mask)
        contribution = MgsaLayerOutput(head_labels=important.long())
        if self.mode == "rhe_prune" and self.training and not torch.compiler.is_compiling() and not important.any():
            logger.warning_once(
                f"RHE-prune: every head of encoder layer {self.layer_idx} is labelled redundant in every sentence "
                "of a training batch, so the layer's self-attention is zeroed and its query, key and value "
                "projections get no gradient (a model trained from scratch starts so with `rhe_gate=\"sigmoid\"`). "
                "Prune a trained RHE model instead (`from_pretrained(rhe_folder, rhe_mode=\"rhe_prune\")`, or "
                "`init_from=` an `rhe` run with `model.rhe_mode=rhe_prune`), or use `rhe_gate=\"confidence\"`."
            )
        if straight_through is not None:  # the learned gate: the hard choice, the soft label's gradient
            label = important.to(weights.dtype) + straight_through
            if self.mode == "rhe_prune":
                weights = weights * label[:, :, None, None]
            else:
                sea_weights = nn.functional.softmax(energy + self.syntax_bias(syntax, energy.dtype), dim=-1)
                weights = sea_weights + label[:, :, None, None] * (weights - sea_weights)
            return self.merge_heads(torch.matmul(self.attention_dropout(weights), value)), weights, contribution
        if self.mode == "rhe_prune" and torch.compiler.is_compiling():
            # the same context with the pruned heads' weights zeroed: the number of kept heads depends on the data,
            # so a compiled graph computes every head rather than break at `nonzero`
            weights = weights * important[:, :, None, None]
            return self.merge_heads(torch.matmul(self.attention_dropout(weights), value)), weights, contribution
        if self.mode == "rhe_prune":
            # only the important (sentence, head) pairs compute a context; the pruned ones stay 0
            rows = important.flatten().nonzero().squeeze(-1)
            selected = self.attention_dropout(weights.flatten(0, 1).index_select(0, rows))
            context = value.new_zeros(value.shape).flatten(0, 1)
            context = context.index_copy(0, rows, torch.matmul(selected, value.flatten(0, 1).index_select(0, rows)))
            weights = weights * important[:, :, None, None]
            return self.merge_heads(context.view_as(value)), weights, contribution
        sea_weights = nn.functional.softmax(energy + self.syntax_bias(syntax, energy.dtype), dim=-1)
        weights = torch.where(important[:, :, None, None], weights, sea_weights)
        context = torch.matmul(self.attention_dropout(weights), value)
        return self.merge_heads(context), weights, contribution


RHE = Variant(
    name="rhe",
    summary="redundant-head enlivening with dependency- and local-phrase-enhanced attention.",
    paper="Enlivening Redundant Heads in Multi-head Self-attention for Machine Translation",
    paper_url="https://aclanthology.org/2021.emnlp-main.260",
    config_fields=RheConfigFields,
    field_prefixes=("rhe_",),
    layers_field="rhe_layers",
    default_layers=(0,),
    self_attention=RheAttention,
    inputs=RheInputs,
    syntax_fields=required_syntax_fields,
    output_fields=("head_labels",),
    # a config saved before `rhe_gate` existed was trained with Eq. 10 as printed
    legacy_values={"rhe_gate": "sigmoid"},
)
