"""MG-SA's recurrences over phrases: the LSTM composition COM (Eq. 8) and the interaction REC over the phrase
sequence (Eq. 11), in two equivalent layouts.

- Packed (eager PyTorch, training): only the real phrases (or a phrase's real words) run, packed by length into a
  `PackedSequence`; the number of steps is the data's longest sequence.
- Padded (under `torch.export`, for ONNX): every sequence of the padded layout runs, as one `scan` (an ONNX `Scan`
  with a dynamic number of steps); a step updates only the sequences still running, so each sequence's outputs and last
  state are the packed layout's, and a padded slot's output is 0 as the packed layout's `index_copy` into zeros gives.
"""

from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from .phrase_partition import PhrasePartition, is_exporting


def packing_index(lengths: torch.LongTensor, num_steps: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    """
    How to pack N padded sequences (N, T, ...) flattened to (N * T, ...) into a `PackedSequence`, longest first.

    Returns:
        `(index, batch_sizes)`: the rows of the flattened sequences in packed (time-major) order, and the number of
        sequences still running at each step (on CPU, as `PackedSequence` wants).
    """
    order = lengths.argsort(descending=True, stable=True)
    steps = torch.arange(num_steps, device=lengths.device).unsqueeze(1)
    running = lengths[order].unsqueeze(0) > steps
    index = (order.unsqueeze(0) * num_steps + steps)[running]
    batch_sizes = running.sum(1).cpu()
    return index, batch_sizes[batch_sizes > 0]


def masked_scan(
    step: Callable[..., tuple[torch.Tensor, ...]],
    state: tuple[torch.Tensor, ...],
    xs: torch.Tensor,
    running: torch.BoolTensor,
    with_outputs: bool = True,
) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...]]:
    """
    A recurrence over N padded sequences as one `scan` over T steps (exported: one ONNX `Scan`, T dynamic).

    Args:
        step: `step(x_t, *state) → new state`, the new hidden state (N, H) first.
        state: the initial state, (N, ...) tensors.
        xs: (T, ...), what step t reads.
        running: (T, N), `True` where sequence n has a step t.
        with_outputs: whether to stack the outputs (else only the state is carried: O(N × H) memory per step).

    Returns:
        `(outputs (T, N, H) or None, final state)`: a sequence's outputs past its last step are 0 and its state stays
        the one after its last step.
    """
    from torch._higher_order_ops.scan import scan  # only the export path runs it

    def combine(carry, inputs):
        x, run = inputs
        new = step(x, *carry)
        carry = tuple(torch.where(run.view(-1, *(1,) * (old.dim() - 1)), value, old) for value, old in zip(
            new, carry, strict=True))
        return carry, (torch.where(run.unsqueeze(-1), new[0], 0.0),) if with_outputs else ()

    final, outputs = scan(combine, tuple(state), (xs, running))
    return (outputs[0] if with_outputs else None), final


def lstm_cell(
    hidden_weight: torch.Tensor, input_gates: torch.Tensor, hidden: torch.Tensor, cell: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of a one-layer `nn.LSTM` (its `weight_hh_l0` (4H, H)) from its input projection
    x W_ih^T + b_ih + b_hh (N, 4H), with PyTorch's gate order i, f, g, o: h, c (N, H) → h, c. (The scan closes over
    the weight, not the module: `torch.compile`, which traces an eager scan, does not take `nn.LSTM` modules.)"""
    gates = input_gates + nn.functional.linear(hidden, hidden_weight)
    input_, forget, candidate, output = gates.chunk(4, -1)
    cell = torch.sigmoid(forget) * cell + torch.sigmoid(input_) * torch.tanh(candidate)
    return torch.sigmoid(output) * torch.tanh(cell), cell


def lstm_input_gates(weights: tuple[torch.Tensor, ...], inputs: torch.Tensor) -> torch.Tensor:
    """x W_ih^T + b_ih + b_hh of a one-layer `nn.LSTM` from its `(weight_ih_l0, bias_ih_l0, bias_hh_l0)`:
    (..., input_size) → (..., 4H)."""
    input_weight, input_bias, hidden_bias = weights
    return nn.functional.linear(inputs, input_weight, input_bias + hidden_bias)


def lstm_weights(lstm: nn.LSTM) -> tuple[torch.Tensor, ...]:
    """A one-layer, unidirectional `nn.LSTM`'s `(weight_ih_l0, bias_ih_l0, bias_hh_l0, weight_hh_l0)`."""
    return lstm.weight_ih_l0, lstm.bias_ih_l0, lstm.bias_hh_l0, lstm.weight_hh_l0


def lstm_padded(lstm: nn.LSTM, inputs: torch.Tensor, lengths: torch.LongTensor) -> tuple[torch.Tensor, tuple[
        torch.Tensor, torch.Tensor]]:
    """
    A one-layer, batch-first `nn.LSTM` over padded sequences as a [`masked_scan`].

    Args:
        inputs: (N, T, input_size).
        lengths: (N,) the steps of each sequence (0 allowed).

    Returns:
        `(outputs (N, T, H), (h_T (N, H), c_T (N, H)))`: outputs past a sequence's length are 0, h_T / c_T are its
        states after its last step (0 for an empty one), as the packed `nn.LSTM` computes them.
    """
    *input_weights, hidden_weight = lstm_weights(lstm)
    steps = torch.arange(inputs.shape[1], device=inputs.device)
    zeros = inputs.new_zeros(inputs.shape[0], lstm.hidden_size)
    outputs, (hidden, cell) = masked_scan(
        lambda gates, hidden, cell: lstm_cell(hidden_weight, gates, hidden, cell), (zeros, zeros.clone()),
        lstm_input_gates(input_weights, inputs).transpose(0, 1), steps.unsqueeze(1) < lengths,
    )
    return outputs.transpose(0, 1), (hidden, cell)


def interaction_packed(interaction: nn.Module, phrases: torch.Tensor, lengths: torch.LongTensor) -> torch.Tensor:
    """
    REC (Eq. 11) over the real phrases only, packed by length: one run of `interaction` (`nn.LSTM` or [`OnLstm`]).

    Args:
        phrases: (N, P, D or d_m), N = B × G phrase sequences.
        lengths: (N,) the real phrases of each sequence (the slots before them).

    Returns:
        (N, P, d_m), padded slots 0.
    """
    num_sequences, num_phrases, dim = phrases.shape
    index, batch_sizes = packing_index(lengths, num_phrases)
    outputs, _ = interaction(PackedSequence(phrases.reshape(-1, dim).index_select(0, index), batch_sizes))
    memory = outputs.data.new_zeros(num_sequences * num_phrases, outputs.data.shape[-1])
    return memory.index_copy(0, index, outputs.data).view(num_sequences, num_phrases, -1)


def interaction_padded(interaction: nn.Module, phrases: torch.Tensor, lengths: torch.LongTensor) -> torch.Tensor:
    """[`interaction_packed`]'s result over the padded layout, as a `scan` (what `torch.export` traces): (N, P, D or
    d_m) → (N, P, d_m), padded slots 0."""
    # Eq. 11, H_g = REC(G_x): step t reads phrase t of every sequence that has one
    if isinstance(interaction, nn.LSTM):
        outputs, _ = lstm_padded(interaction, phrases, lengths)
    else:
        outputs, _ = interaction.forward_padded(phrases, lengths)
    return outputs


class LstmComposition(nn.Module):
    """
    COM = the last hidden state of an LSTM run over the phrase's words (Eq. 8), D → d_m: head h's g^h ∈ R^{d_h} is
    its d_h-wide part (4 × 384 × (512 + 384) = 1.38M parameters per layer at Transformer-base, Table 1's
    (96.1 − 88.0) / 6 = 1.35M). All phrases of all granularities run as one packed batch; (B, L, D) → (B, G, P, d_m).
    """

    def __init__(self, config):
        super().__init__()
        self.output_dim = config.phrase_head_width()
        self.lstm = nn.LSTM(config.d_model, self.output_dim, batch_first=True)

    @torch.compiler.disable
    def forward(self, hidden_states: torch.Tensor, partition: PhrasePartition) -> torch.Tensor:
        """Under `torch.compile` this runs eagerly, as the interaction's recurrence does (its number of steps is the
        longest phrase's length); under `torch.export` it runs [`last_states_padded`]."""
        batch_size, num_granularities, length = partition.phrase_ids.shape
        # the rows of hidden_states (flattened to (B * L, D)) grouped by phrase, and where each segment starts there
        offsets = torch.arange(batch_size, device=hidden_states.device).view(-1, 1, 1) * length
        tokens = (partition.token_order + offsets).flatten()
        segment_lengths = partition.segment_lengths.flatten()
        starts = (segment_lengths.cumsum(0) - segment_lengths).view(-1, partition.num_phrases + 1)[:, :-1].flatten()
        lengths = partition.segment_lengths[..., :-1].flatten()
        run = self.last_states_padded if is_exporting() else self.last_states_packed
        phrases = run(hidden_states.reshape(-1, hidden_states.shape[-1]), tokens, starts, lengths, length)
        return phrases.view(batch_size, num_granularities, partition.num_phrases, self.output_dim)

    def last_states_packed(
        self, words: torch.Tensor, tokens: torch.LongTensor, starts: torch.LongTensor, lengths: torch.LongTensor,
        max_length: int,
    ) -> torch.Tensor:
        """
        The LSTM's last state of every phrase, its real words packed longest first.

        Args:
            words: (B × L, D), the layer input's rows.
            tokens: (B × G × L,) the rows grouped by phrase (phrase order, padding last).
            starts: (N,) where each of the N = B × G × P phrases starts in `tokens`.
            lengths: (N,) its number of words.
            max_length: L, a bound on `lengths` (unused here: the longest phrase sets the steps).

        Returns:
            (N, d_m), empty phrases 0.
        """
        width = int(lengths.max())
        index, batch_sizes = packing_index(lengths, width)
        phrase, step = index // width, index % width
        _, (last_hidden, _) = self.lstm(PackedSequence(words.index_select(0, tokens[starts[phrase] + step]),
                                                       batch_sizes))
        phrases = words.new_zeros(lengths.shape[0], self.output_dim)
        return phrases.index_copy(0, phrase[: batch_sizes[0]], last_hidden[-1])

    def last_states_padded(
        self, words: torch.Tensor, tokens: torch.LongTensor, starts: torch.LongTensor, lengths: torch.LongTensor,
        max_length: int,
    ) -> torch.Tensor:
        """[`last_states_packed`]'s result as a `scan` over `max_length` word steps (what `torch.export` traces):
        step t reads word t of every phrase and updates the phrases that have one, carrying only h, c (N, d_m)."""
        *input_weights, hidden_weight = lstm_weights(self.lstm)
        last_row = tokens.shape[0] - 1

        def step(t, hidden, cell):
            rows = tokens[(starts + t).clamp(max=last_row)]  # word t of each phrase (clamped past the last word)
            input_gates = lstm_input_gates(input_weights, words.index_select(0, rows))
            return lstm_cell(hidden_weight, input_gates, hidden, cell)

        # Eq. 8, g_m = COM(p_m): the last state of each phrase, after its last word
        steps = torch.arange(max_length, device=words.device)
        zeros = words.new_zeros(lengths.shape[0], self.output_dim)
        _, (hidden, _) = masked_scan(step, (zeros, zeros.clone()), steps, steps.unsqueeze(1) < lengths,
                                     with_outputs=False)
        return hidden


__all__ = ["LstmComposition", "interaction_packed", "interaction_padded", "lstm_padded", "masked_scan",
           "packing_index"]
