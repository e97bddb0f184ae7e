"""The MG-SA variant (`encoder_type="phrase_memory"`): multi-granularity self-attention, from "Multi-Granularity
Self-Attention for Neural Machine Translation" (Hao et al., 2019). Its configuration fields, its self-attention and
its [`Variant`] (`PHRASE_MEMORY`).

Some heads (a quarter by default) attend over the words as usual; every other head group attends over the phrase
memory H_g of one granularity (Eq. 4-6): queries stay per word, keys and values are the group's projections of H_g.
H_g is made from the layer input H by

1. partition: non-overlapping n-grams (one granularity per size in `phrase_ngram_sizes`) or the top K levels of the
   constituency tree (`phrase_ids` from the processor);
2. composition COM (Eq. 8): `max` pooling, `mean` pooling, `sans` (per phrase head, the max-pooled vector is the
   query of an attention over the phrase's words) or `lstm` (last state of an LSTM over the phrase's words);
3. optionally, a phrase-tag classifier on the composed vectors of syntactic levels (Eq. 9-10);
4. optionally, an interaction REC over the phrase sequence (Eq. 11): an `lstm` or an `on_lstm` (ordered neurons).

The config's defaults are the paper's final system ("MG-SA" of Table 4, Table 3 row 6): syntactic partition, `sans`
composition, tag supervision and the `on_lstm` interaction in the bottom layer.

Every step works on all sentences, granularities and phrases at once: phrases are a padded `(B, G, P, D)` tensor
built with segment operations (a segment max over tokens sorted by phrase, membership-masked matmuls), recurrences
run once over the real phrases of all granularities packed together (`phrase_recurrence.py`; under `torch.export`,
as scans over the padded phrases, which ONNX runs), and padded phrases are masked out of the attention. Every module's
parameters are shared by the granularities.

Sizes. F_h (Eq. 4) has "its own trainable parameters" per head and g_m ∈ R^{d_h} (Eq. 8): the `sans` and `lstm`
compositions and the interactions give each phrase head a d_h-wide memory, d_m = (phrase heads) × d_h wide in all. With
this reading a Transformer-base model (8 heads, 6 of them phrase heads, d_m = 384) has the parameter counts of
Tables 1-3 within 15%: SANs +0.44M per layer (paper +0.4M), LSTM composition +1.43M (+1.35M), LSTM interaction +1.18M
(+1.1M), ON-LSTM interaction +1.33M (+1.5M); `tests/test_phrase_memory.py` lists them.

Partitions are `(B, G, L)` phrase indices, -1 on padding. N-gram phrases are taken over the real tokens (left to
right, the last one shorter if needed) and the final EOS token is a phrase of its own, as in the syntactic
partition, so that a sentence's phrases never depend on the padding around it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import initialization as init

from .configuration_fields import at_least, checked_field, items_at_least
from .modeling_attention import MgsaAttention, additive_mask
from .modeling_outputs_mgsa import MgsaLayerOutput
from .modeling_syntax_inputs import MgsaSyntaxInputs, require_inputs
from .modeling_variant import Variant
from .on_lstm import OnLstm
from .phrase_partition import PhrasePartition, is_exporting
from .phrase_recurrence import LstmComposition, interaction_packed, interaction_padded


@dataclass(kw_only=True, repr=False)
class PhraseMemoryConfigFields:
    r"""
        phrase_memory_layers (`list[int]`, *optional*, defaults to `[0]`):
            MG-SA: encoder layers whose self-attention is multi-granularity.
        phrase_partition (`str`, defaults to `"syntactic"`):
            MG-SA: `"syntactic"` (the top `phrase_levels` levels of the constituency tree, from the processor) or
            `"ngram"` (non-overlapping n-grams of `phrase_ngram_sizes`, computed in the model).
        phrase_ngram_sizes (`list[int]`, *optional*, defaults to `[2, 3, 4]`):
            MG-SA: n-gram sizes, one granularity each.
        phrase_levels (`int`, defaults to 3):
            Number K of syntactic granularity levels (MG-SA) the processor makes and the model reads.
        phrase_word_heads (`int`, *optional*):
            MG-SA: heads that stay word-level; defaults to a quarter of `encoder_attention_heads`.
        phrase_heads_per_granularity (`list[int]`, *optional*):
            MG-SA: heads given to each granularity; defaults to an even split of the other heads.
        phrase_composition (`str`, defaults to `"sans"`):
            MG-SA: how a phrase's word vectors become one vector: `"max"`, `"mean"`, `"sans"` (the max-pooled vector
            attends inside the phrase) or `"lstm"` (last state).
        phrase_interaction (`str`, defaults to `"on_lstm"`):
            MG-SA: interaction over the phrase sequence: `"none"`, `"lstm"` or `"on_lstm"` (ordered neurons).
        on_lstm_chunk_size (`int`, defaults to 4):
            MG-SA: chunk size of the ON-LSTM master gates (the phrase heads' width must be divisible by it). The
            paper does not give it; 2 gives Table 3 row 6's +1.9M and Table 4's Big +7.4M (rows/phrase_memory).
        phrase_memory_key_value (`str`, defaults to `"head_space"`):
            MG-SA: how phrase heads read a head-space memory g^h ∈ R^{d_h} (Eq. 5's H_g W_K^h, H_g W_V^h):
            `"head_space"`, each phrase head's own d_h × d_h W_K^h, W_V^h; `"none"`, g^h is the key and the value
            (F_h's own parameters, the SANs composition's W_q, W_k, are the head's only new ones: the reading at which
            Tables 1-3's counts come out). A model-space memory (`max`/`mean` composition, no interaction) is read
            through the heads' rows of the key/value projections either way.
        phrase_tag_supervision (`bool`, defaults to `True`):
            MG-SA: predict the tag of each syntactic phrase from its composed vector (needs the syntactic partition).
        phrase_tag_loss_weight (`float`, defaults to 0.001):
            MG-SA: weight λ of the tag loss added to the translation loss (Eq. 12). The tag loss is Eq. 10's sum
            over a sentence's tagged phrases (all levels); Eq. 12 sums both terms per sentence, and as the
            translation loss is a mean over target tokens, the batch's summed tag loss is divided by the same
            target tokens (`modeling_loss.tag_loss_per_target_token`).
        num_phrase_tags (`int`, defaults to 64):
            Size of the phrase tag vocabulary (the processor's `PHRASE_TAGS` must fit).

            The MG-SA defaults are the paper's final system, "MG-SA" of its Table 4 (Table 3 row 6: syntactic
            phrases, tag supervision, ON-LSTM interaction, SANs composition, bottom layer);
            `rows/phrase_memory/` names its other rows (the n-gram ones set `phrase_partition="ngram"`,
            `phrase_tag_supervision=False`, `phrase_interaction="none"`).
    """

    phrase_memory_layers: list[int] | None = checked_field(None, items_at_least(0, non_empty=False))
    phrase_partition: Literal["ngram", "syntactic"] = "syntactic"
    phrase_ngram_sizes: list[int] | None = checked_field(None, items_at_least(1))
    phrase_levels: int = checked_field(3, at_least(1))
    phrase_word_heads: int | None = checked_field(None, at_least(0))
    phrase_heads_per_granularity: list[int] | None = checked_field(None, items_at_least(0))
    phrase_composition: Literal["max", "mean", "sans", "lstm"] = "sans"
    phrase_interaction: Literal["none", "lstm", "on_lstm"] = "on_lstm"
    on_lstm_chunk_size: int = checked_field(4, at_least(1))
    phrase_memory_key_value: Literal["head_space", "none"] = "head_space"
    phrase_tag_supervision: bool = True
    phrase_tag_loss_weight: float | int = checked_field(0.001, at_least(0))
    num_phrase_tags: int = checked_field(64, at_least(1))

    @property
    def trains_tag_loss(self) -> bool:
        """Whether the model adds MG-SA's tag loss (Eq. 10) to its loss."""
        return self.encoder_type == "phrase_memory" and self.phrase_tag_supervision

    @property
    def num_phrase_granularities(self) -> int:
        """Number of MG-SA phrase granularities (n-gram sizes or syntactic levels)."""
        return len(self.phrase_ngram_sizes) if self.phrase_partition == "ngram" else self.phrase_levels

    def phrase_head_allocation(self) -> tuple[int, list[int]]:
        """MG-SA heads as `(word_heads, heads_per_granularity)`."""
        heads = self.encoder_attention_heads
        word_heads = heads // 4 if self.phrase_word_heads is None else self.phrase_word_heads
        per_granularity = self.phrase_heads_per_granularity
        if per_granularity is None:
            share, extra = divmod(heads - word_heads, self.num_phrase_granularities)
            per_granularity = [share + (g < extra) for g in range(self.num_phrase_granularities)]
        return word_heads, list(per_granularity)

    def phrase_head_width(self) -> int:
        """MG-SA's d_m = (phrase heads) × d_h (T5's `d_kv`, else d_model / heads): the width of the head-space phrase
        memory, 384 at Transformer-base."""
        word_heads, _ = self.phrase_head_allocation()
        head_dim = getattr(self, "d_kv", None) or self.d_model // self.encoder_attention_heads
        return (self.encoder_attention_heads - word_heads) * head_dim

    def validate_phrase_heads(self):
        """MG-SA's heads add up to the encoder's, and the ON-LSTM chunks divide the phrase heads' width."""
        heads = self.encoder_attention_heads
        word_heads, per_granularity = self.phrase_head_allocation()
        if not 0 <= word_heads < heads:
            raise ValueError(f"`phrase_word_heads` must be in [0, {heads}), got {word_heads!r}.")
        if len(per_granularity) != self.num_phrase_granularities or any(h < 0 for h in per_granularity):
            raise ValueError(
                f"`phrase_heads_per_granularity` must list a non-negative head count for each of the "
                f"{self.num_phrase_granularities} granularities, got {per_granularity!r}."
            )
        if word_heads + sum(per_granularity) != heads:
            raise ValueError(
                f"`phrase_word_heads` ({word_heads}) + `phrase_heads_per_granularity` ({per_granularity}) must add up "
                f"to `encoder_attention_heads` ({heads})."
            )
        phrase_width = self.phrase_head_width()
        if self.encoder_type == "phrase_memory" and self.phrase_interaction == "on_lstm" and (
            phrase_width % self.on_lstm_chunk_size
        ):
            raise ValueError(
                f"The ON-LSTM interaction is as wide as the {heads - word_heads} phrase heads ({phrase_width}), "
                f"which `on_lstm_chunk_size` ({self.on_lstm_chunk_size}) must divide."
            )


def ngram_phrase_ids(padding_mask: torch.BoolTensor, sizes: list[int]) -> torch.LongTensor:
    """
    Non-overlapping n-gram partition (Section 3.2, "Phrase Partition") of the real tokens of each sentence.

    Args:
        padding_mask: (B, L), `True` on real tokens; the last real token is the EOS.
        sizes: the n of each granularity.

    Returns:
        (B, G, L) phrase indices: token r (counting real tokens) is in phrase r // n, the EOS in phrase
        ceil((length - 1) / n), padding -1.
    """
    sizes = torch.tensor(sizes, device=padding_mask.device).view(1, -1, 1)
    rank = (padding_mask.long().cumsum(-1) - 1).unsqueeze(1)
    last = padding_mask.sum(-1).view(-1, 1, 1) - 1
    eos_phrase = (last + sizes - 1) // sizes
    phrase_ids = torch.where(rank == last, eos_phrase, rank // sizes)
    return phrase_ids.masked_fill(~padding_mask.unsqueeze(1), -1)


def phrase_partition(config, syntax: MgsaSyntaxInputs) -> PhrasePartition:
    """The configured partition of a batch: n-grams from `syntax.padding_mask` or the top K levels of `phrase_ids`."""
    padding_mask = syntax.padding_mask
    length = padding_mask.shape[-1]
    if config.phrase_partition == "ngram":
        phrase_ids = ngram_phrase_ids(padding_mask, config.phrase_ngram_sizes)
        num_phrases = (length - 1 + min(config.phrase_ngram_sizes) - 1) // min(config.phrase_ngram_sizes) + 1
        return PhrasePartition(phrase_ids, min(num_phrases, length))

    needed_by = 'encoder_type="phrase_memory" with phrase_partition="syntactic"'
    syntax.require("phrase_ids", needed_by=needed_by)
    levels = config.phrase_levels
    if syntax.phrase_ids.dim() != 3 or syntax.phrase_ids.shape[1] < levels:
        raise ValueError(
            f"{needed_by} reads `phrase_ids` of shape (batch, levels >= {levels}, seq_len), got "
            f"{tuple(syntax.phrase_ids.shape)}: make the processor produce `phrase_levels` = {levels} levels."
        )
    phrase_ids = syntax.phrase_ids[:, :levels].masked_fill(~padding_mask.unsqueeze(1), -1)
    if torch.compiler.is_compiling():
        # a bound that follows from the shape, as the phrase keys are padded to L anyway: the graph does not depend on
        # the data, and the phrases past a sentence's last are empty and masked; the numbering is checked on the device
        torch._assert_async(phrase_ids.max() < length, "`phrase_ids` must number a sentence's phrases 0, 1, ...")
        return PhrasePartition(phrase_ids, length)
    num_phrases = int(phrase_ids.max()) + 1
    if num_phrases > length:
        raise ValueError(
            f"`phrase_ids` numbers {num_phrases} phrases in sequences of {length} tokens: phrases must be numbered "
            "0, 1, ... left to right within each sentence."
        )
    return PhrasePartition(phrase_ids, max(num_phrases, 1))


@dataclass
class PhraseMemoryInputs:
    """
    What the MG-SA layers of one forward read, made once from the source syntax ([`from_syntax`]).

    Attributes:
        padding_mask: (B, L), `True` on real tokens.
        partition: the phrases of every granularity.
        phrase_tags: (B, levels, L) phrase tag ids for tag supervision (Eq. 9-10), or None (no tag loss).
    """

    padding_mask: torch.BoolTensor
    partition: PhrasePartition
    phrase_tags: torch.LongTensor | None = None

    @classmethod
    def from_syntax(
        cls, config, syntax: MgsaSyntaxInputs, hidden_states: torch.Tensor | None = None
    ) -> "PhraseMemoryInputs":
        """The phrase partition of every granularity (`phrase_partition`) and, with tag supervision, the checked
        `phrase_tags` of a batch's [`MgsaSyntaxInputs`]; `hidden_states` is not read."""
        partition = phrase_partition(config, syntax)
        phrase_tags = syntax.phrase_tags if config.phrase_tag_supervision else None
        if phrase_tags is not None:
            syntax.require("phrase_tags", needed_by="MG-SA phrase tag supervision")
            levels = partition.phrase_ids.shape[1]
            if phrase_tags.dim() != 3 or phrase_tags.shape[1] < levels:
                raise ValueError(
                    f"`phrase_tags` must be (batch, levels >= {levels}, seq_len) like `phrase_ids`, got "
                    f"{tuple(phrase_tags.shape)}."
                )
        return cls(padding_mask=syntax.padding_mask, partition=partition, phrase_tags=phrase_tags)


class MaxComposition(nn.Module):
    """COM = max pooling (the paper's CNN composition, Eq. 8): phrase vectors in the model's space, (B, G, P, D)."""

    def __init__(self, config):
        super().__init__()
        self.output_dim = config.d_model

    def forward(self, hidden_states: torch.Tensor, partition: PhrasePartition) -> torch.Tensor:
        """
        Eq. 8 with COM = max pooling: each phrase's vector is the element-wise max of its words' x_i.

        Args:
            hidden_states: (B, L, D), the layer input H.
            partition: the batch's phrases of every granularity.

        Returns:
            (B, G, P, D), the phrase memories H_g side by side; padded phrases hold 0.
        """
        return partition.max_pool(hidden_states)


class MeanComposition(MaxComposition):
    """COM = mean of the phrase's word vectors, (B, G, P, D)."""

    def forward(self, hidden_states: torch.Tensor, partition: PhrasePartition) -> torch.Tensor:
        """
        Eq. 8 with COM = mean pooling: each phrase's vector is the mean of its words' x_i.

        Args:
            hidden_states: (B, L, D), the layer input H.
            partition: the batch's phrases of every granularity.

        Returns:
            (B, G, P, D), the phrase memories H_g side by side; padded phrases hold 0.
        """
        weights = partition.membership.to(hidden_states.dtype)
        weights = weights / weights.sum(-1, keepdim=True).clamp(min=1.0)
        return weights @ hidden_states.unsqueeze(1)


class SansComposition(nn.Module):
    r"""
    COM = SANs (Eq. 8), one per phrase head ("F_h ... with its own trainable parameters", Eq. 4): head h scores the
    phrase's words x_i against the max-pooled phrase vector m, g^h = Σ_i softmax_i((m W_q^h)(x_i W_k^h)ᵀ / √d_h)
    (x_i W_k^h), with W_q^h, W_k^h ∈ R^{D×d_h}, so that g^h ∈ R^{d_h} as Eq. 8 states. 2 × 6 × 512 × 64 = 0.39M
    parameters per layer at Transformer-base, Table 1-3's +0.4M. Every head composes the phrases of every granularity
    (a head reads its own granularity's; the interaction reads all heads'): (B, L, D) → (B, G, P, d_m), the heads'
    g^h side by side.
    """

    def __init__(self, config):
        super().__init__()
        word_heads, _ = config.phrase_head_allocation()
        self.output_dim = config.phrase_head_width()
        self.head_dim = self.output_dim // (config.encoder_attention_heads - word_heads)
        self.query_proj = nn.Linear(config.d_model, self.output_dim, bias=False)  # W_q^h of every phrase head
        self.key_proj = nn.Linear(config.d_model, self.output_dim, bias=False)  # W_k^h

    def forward(self, hidden_states: torch.Tensor, partition: PhrasePartition) -> torch.Tensor:
        """
        Eq. 8 with COM = SANs: per phrase head h, g^h = Σ_i softmax_i((m W_q^h)(x_i W_k^h)ᵀ / √d_h) (x_i W_k^h), the
        softmax running over the phrase's words x_i and m being their max-pooled vector.

        Args:
            hidden_states: (B, L, D), the layer input H.
            partition: the batch's phrases of every granularity.

        Returns:
            (B, G, P, d_m), the phrase heads' g^h ∈ R^{d_h} side by side; padded phrases hold 0.
        """
        batch_size, num_granularities, num_phrases = partition.phrase_mask.shape
        heads = self.output_dim // self.head_dim
        key = self.key_proj(hidden_states).view(batch_size, 1, -1, heads, self.head_dim).transpose(2, 3)
        # Each word's score against its own phrase's query only, (B, G, heads, L); the softmax and the sum run over
        # segments, padding words going to an extra slot P that is dropped at the end. The scores are recomputed in
        # the backward pass rather than kept: their inputs (the pooled phrases, the queries gathered to the words) are
        # (B, G, L, D)-sized, the largest tensors of the composition.
        phrase_index = partition.scatter_index.unsqueeze(2).expand(-1, -1, heads, -1)  # (B, G, heads, L)
        if torch.is_grad_enabled():
            scores = checkpoint(self.word_scores, hidden_states, key, partition, phrase_index, use_reentrant=False)
        else:
            scores = self.word_scores(hidden_states, key, partition, phrase_index)
        slot_shape = (batch_size, num_granularities, heads, num_phrases + 1)
        phrase_max = scores.new_zeros(slot_shape).scatter_reduce(
            3, phrase_index, scores.detach(), "amax", include_self=False
        )
        exp_scores = (scores - phrase_max.gather(3, phrase_index)).exp()
        phrase_sums = scores.new_zeros(slot_shape).scatter_add(3, phrase_index, exp_scores)
        weights = exp_scores / phrase_sums.gather(3, phrase_index)  # softmax inside the phrase; its max gives >= 1
        phrases = key.new_zeros(*slot_shape, self.head_dim).scatter_add(
            3, phrase_index.unsqueeze(-1).expand(-1, -1, -1, -1, self.head_dim), weights.unsqueeze(-1) * key
        )  # empty phrases: 0
        phrases = phrases[:, :, :, :num_phrases].transpose(2, 3)
        return phrases.reshape(batch_size, num_granularities, num_phrases, self.output_dim)

    def word_scores(
        self, hidden_states: torch.Tensor, key: torch.Tensor, partition: PhrasePartition, phrase_index: torch.Tensor
    ) -> torch.Tensor:
        """(m W_q^h)(x_i W_k^h)ᵀ / √d_h of each word x_i with its phrase's max-pooled m: (B, G, heads, L)."""
        batch_size, num_granularities, num_phrases = partition.phrase_mask.shape
        query = self.query_proj(partition.max_pool(hidden_states))
        query = query.view(batch_size, num_granularities, num_phrases, -1, self.head_dim).transpose(2, 3)
        word_query = nn.functional.pad(query, (0, 0, 0, 1)).gather(
            3, phrase_index.unsqueeze(-1).expand(-1, -1, -1, -1, self.head_dim)
        )
        return (word_query * key).sum(-1) * self.head_dim**-0.5


class HeadSpaceKeyValue(nn.Module):
    """Eq. 5 for a head-space phrase memory: each phrase head's own W_K^h, W_V^h ∈ R^{d_h×d_h}."""

    def __init__(self, config, num_heads: int, head_dim: int):
        super().__init__()
        self.key_weight = nn.Parameter(torch.empty(num_heads, head_dim, head_dim))
        self.value_weight = nn.Parameter(torch.empty(num_heads, head_dim, head_dim))
        self.init_variant_parameters(config)

    def init_variant_parameters(self, config):
        """W_K^h and W_V^h drawn from N(0, `config.variant_init_std`²)."""
        init.normal_(self.key_weight, std=config.variant_init_std)
        init.normal_(self.value_weight, std=config.variant_init_std)

    def forward(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """memory (B, heads, P, d_h) → keys, values (B, heads, P, d_h)."""
        return (
            torch.einsum("bhpc,hcd->bhpd", memory, self.key_weight),
            torch.einsum("bhpc,hcd->bhpd", memory, self.value_weight),
        )


PHRASE_COMPOSITIONS: dict[str, Callable[..., nn.Module]] = {
    "max": MaxComposition,
    "mean": MeanComposition,
    "sans": SansComposition,
    "lstm": LstmComposition,
}

# REC of Eq. 11, input width → d_m: an LSTM of 384 → 384 is 1.18M parameters at Transformer-base (Table 3 row 5,
# +1.1M), an ON-LSTM with chunks of 4 is 1.33M (row 6, +1.5M)
PHRASE_INTERACTIONS: dict[str, Callable[..., nn.Module]] = {
    "lstm": lambda config, input_dim: nn.LSTM(input_dim, config.phrase_head_width(), batch_first=True),
    "on_lstm": lambda config, input_dim: OnLstm(input_dim, config.phrase_head_width(), config.on_lstm_chunk_size),
}


class PhraseMemoryAttention(MgsaAttention):
    """
    MG-SA encoder self-attention (Eq. 4-7). Heads `[0, word_heads)` attend over the words; then each granularity's
    head group, in order, attends over that granularity's phrase memory H_g. The projections are [`MgsaAttention`]'s
    (loadable from Marian or T5). On the T5 backbone the word heads add T5's relative position bias; the phrase heads
    attend over phrases, which have no token position, and get none.

    Where the phrase memory lives: `max`/`mean` composition without interaction keeps it in the model's space (D), and
    the phrase heads read it through their rows of the key/value projections, as word heads read H. The `sans` and
    `lstm` compositions and every interaction make it head-space, g^h ∈ R^{d_h} per head (Eq. 8); Eq. 5's W_K^h, W_V^h
    are then the head's own d_h × d_h matrices ([`HeadSpaceKeyValue`]).

    Backends: `eager` (explicit weights) and `sdpa`; the phrase heads' keys are not the tokens', which flex and
    flash attention's masks cannot express, so they raise.

    New modules: `composition` (`sans`: `query_proj`, `key_proj`; `lstm`: `lstm`), `interaction` (`nn.LSTM` or
    [`OnLstm`], shared by the granularities, which run as one batch), `tag_classifier` (W_t, b_t of Eq. 9) and, for a
    head-space memory read through Eq. 5's matrices (`phrase_memory_key_value="head_space"`), `phrase_key_value`.
    """

    supported_attn_implementations = ("eager", "sdpa")

    def __init__(self, config, num_heads: int, is_decoder: bool = False, is_causal: bool = False, layer_idx=None,
                 **kwargs):
        super().__init__(config, num_heads, is_decoder=is_decoder, is_causal=is_causal, layer_idx=layer_idx, **kwargs)
        if config.phrase_tag_supervision and config.phrase_partition != "syntactic":
            raise ValueError(
                "`phrase_tag_supervision=True` (the default) needs `phrase_partition='syntactic'`: only syntactic "
                "phrases have tags. N-gram rows set `phrase_tag_supervision=False` "
                "(rows/phrase_memory/ngram_*.json)."
            )
        self.word_heads, self.heads_per_granularity = config.phrase_head_allocation()
        # granularity of each phrase head, in head order
        self.head_granularity = [g for g, heads in enumerate(self.heads_per_granularity) for _ in range(heads)]
        self.composition = PHRASE_COMPOSITIONS[config.phrase_composition](config)
        self.interaction = (
            PHRASE_INTERACTIONS[config.phrase_interaction](config, self.composition.output_dim)
            if config.phrase_interaction != "none"
            else None
        )
        self.tag_classifier = (
            nn.Linear(self.composition.output_dim, config.num_phrase_tags) if config.phrase_tag_supervision else None
        )
        self.memory_in_head_space = config.phrase_composition in ("sans", "lstm") or self.interaction is not None
        phrase_heads = num_heads - self.word_heads
        # Eq. 5's W_K^h, W_V^h on g^h, or none (`phrase_memory_key_value="none"`: g^h is read as key and value)
        projected = self.memory_in_head_space and config.phrase_memory_key_value == "head_space"
        self.phrase_key_value = HeadSpaceKeyValue(config, phrase_heads, self.head_dim) if projected else None

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        syntax: PhraseMemoryInputs | None = None,
        position_bias: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None, MgsaLayerOutput]:
        """
        Args:
            hidden_states: (B, L, D), the layer input H.
            attention_mask: unused; keys are masked from `syntax.padding_mask` and the phrase partition.
            position_bias: T5's relative position bias (1, H, L, L), added to the word heads only.
            syntax: the batch's [`PhraseMemoryInputs`] (the encoder makes them once per forward).

        Returns:
            `(output (B, L, D), weights (B, H, L, L) or None, MgsaLayerOutput with the tag_loss (B,) or None)`: for
            phrase heads the last dimension of the weights indexes phrases (slots past the last phrase are 0).
        """
        require_inputs(syntax, PhraseMemoryInputs, self)
        self.check_attn_implementation()
        partition = syntax.partition
        phrases = self.composition(hidden_states, partition)  # Eq. 8, (B, G, P, D or d_m)
        tag_loss = None
        if self.tag_classifier is not None and syntax.phrase_tags is not None:
            tag_loss = self.tag_loss(phrases, partition, syntax.phrase_tags)
        if self.interaction is not None:
            phrases = self.interact(phrases, partition)  # Eq. 11, (B, G, P, d_m)

        query_states = self.split_heads(self.query_proj(hidden_states))
        key_states, value_states = self.memory_keys_values(hidden_states, phrases)
        key_mask = self.key_mask(syntax.padding_mask, partition, query_states.dtype)
        if position_bias is not None:
            phrase_heads = self.num_heads - self.word_heads
            key_mask = key_mask + nn.functional.pad(position_bias[:, : self.word_heads], (0, 0, 0, 0, 0, phrase_heads))

        attn_output, attn_weights = self.attend(query_states, key_states, value_states, key_mask, **kwargs)
        attn_output = attn_output.reshape(*hidden_states.shape[:-1], -1).contiguous()
        return self.output_proj(attn_output), attn_weights, MgsaLayerOutput(tag_loss=tag_loss)

    @torch.compiler.disable
    def interact(self, phrases: torch.Tensor, partition: PhrasePartition) -> torch.Tensor:
        """
        REC over each phrase sequence (Eq. 11): (B, G, P, D or d_m) → (B, G, P, d_m). The granularities are stacked
        into the batch and the sequences packed, so the recurrence runs once and only over real phrases (padded slots
        become 0). Its number of steps depends on the data, so under `torch.compile` it runs eagerly (compiled, it
        would be unrolled and recompiled for every phrase count); under `torch.export` it runs over the padded
        sequences as a scan, which computes the same ([`~phrase_recurrence.interaction_padded`]).
        """
        batch_size, num_granularities, num_phrases, dim = phrases.shape
        lengths = (partition.phrase_ids.amax(-1) + 1).flatten()  # a sequence's real phrases: the slots before these
        run = interaction_padded if is_exporting() else interaction_packed
        memory = run(self.interaction, phrases.reshape(-1, num_phrases, dim), lengths)
        return memory.view(batch_size, num_granularities, num_phrases, -1)

    def memory_keys_values(self, hidden_states: torch.Tensor, phrases: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """
        Eq. 5: keys and values (B, H, L, d_h) of every head. Word heads project H (B, L, D). The heads of granularity
        g read its phrase memory H_g: a (B, P, D) memory through their rows of the key/value projections, a head-space
        (B, P, d_m) one through each head's own W_K^h, W_V^h on its d_h-wide part. Phrase keys and values are
        zero-padded from P to L slots.
        """
        word_rows = slice(0, self.word_heads * self.head_dim)
        word_keys = self.project(self.key_proj, hidden_states, word_rows)
        word_values = self.project(self.value_proj, hidden_states, word_rows)
        if self.memory_in_head_space:
            parts, start = [], 0
            for memory, heads in zip(phrases.unbind(1), self.heads_per_granularity, strict=True):
                parts.append(self.split_heads(memory[..., start : start + heads * self.head_dim]))
                start += heads * self.head_dim
            memory = torch.cat(parts, 1)  # (B, phrase heads, P, d_h)
            if self.phrase_key_value is None:
                phrase_keys = phrase_values = memory
            else:
                phrase_keys, phrase_values = self.phrase_key_value(memory)
        else:
            phrase_keys, phrase_values, start = [], [], word_rows.stop
            for memory, heads in zip(phrases.unbind(1), self.heads_per_granularity, strict=True):
                rows = slice(start, start + heads * self.head_dim)
                phrase_keys.append(self.project(self.key_proj, memory, rows))
                phrase_values.append(self.project(self.value_proj, memory, rows))
                start = rows.stop
            phrase_keys, phrase_values = torch.cat(phrase_keys, 1), torch.cat(phrase_values, 1)
        padding = (0, 0, 0, hidden_states.shape[1] - phrases.shape[2])
        keys = torch.cat([word_keys, nn.functional.pad(phrase_keys, padding)], 1)
        values = torch.cat([word_values, nn.functional.pad(phrase_values, padding)], 1)
        return keys, values

    def project(self, projection: nn.Linear, states: torch.Tensor, rows: slice) -> torch.Tensor:
        """The heads `rows` of a key/value projection: (B, T, D) → (B, heads, T, d_h)."""
        bias = None if projection.bias is None else projection.bias[rows]
        return self.split_heads(nn.functional.linear(states, projection.weight[rows], bias))

    def key_mask(self, padding_mask: torch.BoolTensor, partition: PhrasePartition, dtype: torch.dtype) -> torch.Tensor:
        """Additive (B, H, 1, L) key mask: the dtype's min on padding tokens (word heads) and padded phrases."""
        length = padding_mask.shape[-1]
        word_mask = padding_mask.unsqueeze(1).expand(-1, self.word_heads, -1)
        phrase_mask = partition.phrase_mask[:, self.head_granularity]
        phrase_mask = nn.functional.pad(phrase_mask, (0, length - partition.num_phrases), value=False)
        return additive_mask(torch.cat([word_mask, phrase_mask], 1).unsqueeze(2), dtype)

    def tag_loss(
        self, phrases: torch.Tensor, partition: PhrasePartition, phrase_tags: torch.LongTensor
    ) -> torch.Tensor:
        """
        Eq. 9-10: L_tag = -Σ_i log p_θi(t_i), the cross-entropy of each phrase's tag predicted from its composed
        vector, summed per sentence over its real, tagged phrases of all levels (EOS and padding carry -100 and are
        ignored). Returns (B,); the model averages it over the batch's sentences.
        """
        num_levels = partition.phrase_ids.shape[1]
        token_tags = phrase_tags[:, :num_levels].masked_fill(partition.phrase_ids < 0, -100)
        if torch.compiler.is_compiling():  # checked on the device, without reading the value back into the graph
            torch._assert_async(token_tags.max() < self.config.num_phrase_tags, "`phrase_tags` exceed num_phrase_tags")
        elif int(token_tags.max()) >= self.config.num_phrase_tags:
            raise ValueError(
                f"`phrase_tags` holds tag id {int(token_tags.max())} but `num_phrase_tags` is "
                f"{self.config.num_phrase_tags}."
            )
        tags = token_tags.new_full(partition.segment_lengths.shape, -100)
        tags = tags.scatter_reduce(2, partition.scatter_index, token_tags, "amax")[:, :, : partition.num_phrases]
        logits = self.tag_classifier(phrases)
        losses = nn.functional.cross_entropy(logits.flatten(0, 2), tags.flatten(), ignore_index=-100, reduction="none")
        # Eq. 10 sums over the phrases (a per-phrase mean would weigh a sentence's tags by 1 / its phrase count)
        return losses.view(tags.shape[0], -1).sum(-1)


__all__ = [
    "PhraseMemoryAttention",
    "PhraseMemoryInputs",
    "PhrasePartition",
    "ngram_phrase_ids",
    "phrase_partition",
]


def phrase_memory_syntax_fields(config) -> tuple[str, ...]:
    """The source syntax MG-SA's logits read: the syntactic partition's `phrase_ids` (the n-gram one is made in the
    model; `phrase_tags` feed only the tag loss)."""
    return ("phrase_ids",) if config.phrase_partition == "syntactic" else ()


def phrase_memory_compiles_fullgraph(config) -> bool:
    """A recurrence (`phrase_interaction="lstm"` or `"on_lstm"`, `phrase_composition="lstm"`) runs as many steps as
    the batch's phrases need, so it runs eagerly between compiled graphs."""
    return config.phrase_interaction == "none" and config.phrase_composition != "lstm"


PHRASE_MEMORY = Variant(
    name="phrase_memory",
    summary="Multi-Granularity Self-Attention: some heads attend over n-gram or syntactic phrases.",
    paper="Multi-Granularity Self-Attention for Neural Machine Translation",
    paper_url="https://arxiv.org/abs/1909.02222",
    config_fields=PhraseMemoryConfigFields,
    field_prefixes=("phrase_", "on_lstm_", "num_phrase_"),
    layers_field="phrase_memory_layers",
    default_layers=(0,),
    none_defaults={"phrase_ngram_sizes": [2, 3, 4]},
    self_attention=PhraseMemoryAttention,
    inputs=PhraseMemoryInputs,
    syntax_fields=phrase_memory_syntax_fields,
    output_fields=("tag_loss",),
    compiles_fullgraph=phrase_memory_compiles_fullgraph,
)
