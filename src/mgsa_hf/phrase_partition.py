"""MG-SA's phrase partition (Section 3.2, "Phrase Partition"): the phrases of every granularity of a batch, and the
segment layout that the compositions (Eq. 5-8) and the recurrences over phrases read."""

from dataclasses import dataclass, field

import torch


# `torch.export` is tracing (torch >= 2.7; before, any trace takes the exportable form, which computes the same)
is_exporting = getattr(torch.compiler, "is_exporting", torch.compiler.is_compiling)


@dataclass
class PhrasePartition:
    """
    The phrases of every granularity of a batch.

    Attributes:
        phrase_ids: (B, G, L) phrase index of each token at each granularity, -1 on padding.
        num_phrases: P, the padded number of phrases (the same for every granularity).
        scatter_index: (B, G, L) phrase index with padding sent to an extra slot P, for scatter operations into P + 1
            slots.
        segment_lengths: (B, G, P + 1) number of tokens of each phrase, then of padding tokens.
        phrase_mask: (B, G, P) `True` for real (non-empty) phrases.
        token_order: (B, G, L) token positions sorted by phrase (stable), padding last: the segments of
            `segment_lengths`.

    The last four are derived once, when the partition is made (every composition reads them), so a partition is
    never written afterwards: layers, checkpointed functions and `torch.compile`d graphs only read it.
    """

    phrase_ids: torch.LongTensor
    num_phrases: int
    scatter_index: torch.LongTensor = field(init=False)
    segment_lengths: torch.LongTensor = field(init=False)
    phrase_mask: torch.BoolTensor = field(init=False)
    token_order: torch.LongTensor = field(init=False)

    def __post_init__(self):
        self.scatter_index = self.phrase_ids.masked_fill(self.phrase_ids < 0, self.num_phrases)
        counts = self.phrase_ids.new_zeros(*self.phrase_ids.shape[:2], self.num_phrases + 1)
        self.segment_lengths = counts.scatter_add_(2, self.scatter_index, torch.ones_like(self.scatter_index))
        self.phrase_mask = self.segment_lengths[..., : self.num_phrases] > 0
        if is_exporting():
            # ONNX has no stable sort: keys made unique by the token position sort the same way
            length = self.phrase_ids.shape[-1]
            positions = torch.arange(length, device=self.phrase_ids.device)
            self.token_order = (self.scatter_index * length + positions).argsort(dim=-1)
        else:
            self.token_order = self.scatter_index.argsort(dim=-1, stable=True)

    @property
    def membership(self) -> torch.BoolTensor:
        """(B, G, P, L): `True` where token l belongs to phrase p (the mean composition's weights; made when read)."""
        phrases = torch.arange(self.num_phrases, device=self.phrase_ids.device)
        return self.phrase_ids.unsqueeze(2) == phrases[:, None]

    def max_pool(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Element-wise max over each phrase's word vectors: (B, L, D) → (B, G, P, D); empty phrases hold 0."""
        batch_size, num_granularities, length = self.phrase_ids.shape
        dim = hidden_states.shape[-1]
        slots_shape = (batch_size, num_granularities, self.num_phrases + 1, dim)
        if is_exporting():
            # ONNX has no segment reduction: the same maxima scattered into the phrase slots (ScatterElements "max")
            index = self.scatter_index.unsqueeze(-1).expand(-1, -1, -1, dim)
            words = hidden_states.unsqueeze(1).expand(-1, num_granularities, -1, -1)
            pooled = hidden_states.new_zeros(slots_shape).scatter_reduce(2, index, words, "amax", include_self=False)
        else:
            index = self.token_order.view(batch_size, num_granularities * length, 1).expand(-1, -1, dim)
            segments = hidden_states.gather(1, index).view(-1, dim)
            pooled = torch.segment_reduce(segments, "max", lengths=self.segment_lengths.flatten(), unsafe=True)
        pooled = pooled.view(slots_shape)[:, :, : self.num_phrases]
        return pooled.masked_fill(~self.phrase_mask.unsqueeze(-1), 0.0)
