"""Ordered-neurons LSTM (ON-LSTM) from "Ordered Neurons: Integrating Tree Structures into Recurrent Neural Networks"
(Shen et al., 2018), used by MG-SA as the interaction over the phrase sequence."""

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from .phrase_recurrence import masked_scan


def cumax(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """cumax(x) = cumsum(softmax(x)): a soft, monotonically increasing split point (Shen et al., 2018, §4.1)."""
    return torch.cumsum(nn.functional.softmax(logits, dim=dim), dim=dim)


class OnLstm(nn.Module):
    r"""
    One unidirectional, batch-first ON-LSTM layer with a zero initial state.

    Besides the LSTM gates (forget f, input i, output o, candidate ĉ), the master forget and input gates
    f̃ = cumax(·) and ĩ = 1 − cumax(·) order the neurons; each master-gate unit controls a chunk of `chunk_size`
    neurons (Shen et al., 2018, §4.2):

        ω = f̃ ∘ ĩ,  f̂ = f ∘ ω + (f̃ − ω),  î = i ∘ ω + (ĩ − ω),  c_t = f̂ ∘ c_{t−1} + î ∘ ĉ,  h_t = o ∘ tanh(c_t)

    All gates are fused: one `Linear` projects the inputs of every time step before the loop, one `Linear` projects
    the previous hidden state inside it. Like [`torch.nn.LSTM`], [`forward`] takes a padded batch or a
    [`~torch.nn.utils.rnn.PackedSequence`] (then each step only computes the sequences still running) and returns
    `(outputs, (h_T, c_T))`. [`forward_padded`] computes what a packed batch gives as one `scan` over a padded one,
    which `torch.export` traces into an ONNX `Scan`.
    """

    def __init__(self, input_size: int, hidden_size: int, chunk_size: int):
        super().__init__()
        if hidden_size % chunk_size:
            raise ValueError(
                f"ON-LSTM hidden size ({hidden_size}) must be divisible by `on_lstm_chunk_size` ({chunk_size})."
            )
        self.hidden_size = hidden_size
        self.chunk_size = chunk_size
        self.num_chunks = hidden_size // chunk_size
        num_gates = 4 * hidden_size + 2 * self.num_chunks
        self.input_gates = nn.Linear(input_size, num_gates)
        self.hidden_gates = nn.Linear(hidden_size, num_gates, bias=False)

    def forward(
        self, inputs: torch.Tensor | PackedSequence
    ) -> tuple[torch.Tensor | PackedSequence, tuple[torch.Tensor, torch.Tensor]]:
        """
        Args:
            inputs: (N, T, input_size), or a `PackedSequence` of N sequences.

        Returns:
            `(outputs, (h_T (N, hidden_size), c_T (N, hidden_size)))`; outputs are (N, T, hidden_size), or a
            `PackedSequence` for packed inputs, and h_T / c_T the states after each sequence's last step.
        """
        if isinstance(inputs, PackedSequence):
            outputs, (hidden, cell) = self.run(inputs.data, inputs.batch_sizes.tolist())
            if inputs.unsorted_indices is not None:
                hidden, cell = hidden[inputs.unsorted_indices], cell[inputs.unsorted_indices]
            return inputs._replace(data=outputs), (hidden, cell)
        batch_size, num_steps, _ = inputs.shape
        outputs, states = self.run(inputs.transpose(0, 1).reshape(-1, inputs.shape[-1]), [batch_size] * num_steps)
        return outputs.view(num_steps, batch_size, -1).transpose(0, 1), states

    def forward_padded(
        self, inputs: torch.Tensor, lengths: torch.LongTensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """
        The packed [`forward`]'s result on padded sequences, as a scan whose steps update only the sequences still
        running (the ONNX form of MG-SA's interaction, Eq. 11).

        Args:
            inputs: (N, T, input_size).
            lengths: (N,) the steps of each sequence (0 allowed).

        Returns:
            `(outputs (N, T, hidden_size), (h_T (N, hidden_size), c_T (N, hidden_size)))`: outputs past a sequence's
            length are 0, h_T / c_T are its states after its last step (0 for an empty one).
        """
        batch_size, num_steps, _ = inputs.shape
        steps = torch.arange(num_steps, device=inputs.device)
        hidden = inputs.new_zeros(batch_size, self.hidden_size)
        cell = inputs.new_zeros(batch_size, self.num_chunks, self.chunk_size)
        outputs, (hidden, cell) = masked_scan(
            self.step, (hidden, cell), self.input_gates(inputs).transpose(0, 1), steps.unsqueeze(1) < lengths
        )
        return outputs.transpose(0, 1), (hidden, cell.flatten(1))

    def run(self, inputs: torch.Tensor, batch_sizes: list[int]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """
        The time loop over time-major packed inputs (sum(batch_sizes), input_size): step t reads the next
        `batch_sizes[t]` rows (non-increasing, the sequences still running). Returns the outputs in the same layout
        and the final (h, c) of each sequence.
        """
        hidden = inputs.new_zeros(batch_sizes[0], self.hidden_size)
        cell = inputs.new_zeros(batch_sizes[0], self.num_chunks, self.chunk_size)
        outputs, final_hidden, final_cell = [], [], []
        for input_gates in self.input_gates(inputs).split(batch_sizes):
            running = input_gates.shape[0]
            if running < hidden.shape[0]:
                final_hidden.append(hidden[running:])
                final_cell.append(cell[running:])
                hidden, cell = hidden[:running], cell[:running]
            hidden, cell = self.step(input_gates, hidden, cell)
            outputs.append(hidden)
        final_hidden.append(hidden)
        final_cell.append(cell)
        return torch.cat(outputs), (torch.cat(final_hidden[::-1]), torch.cat(final_cell[::-1]).flatten(1))

    def step(
        self, input_gates: torch.Tensor, hidden: torch.Tensor, cell: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One time step: input gates (N, num_gates), h (N, hidden_size), c (N, num_chunks, chunk_size) → (h, c)."""
        gates = input_gates + self.hidden_gates(hidden)
        master_forget, master_input, gates = gates.split([self.num_chunks, self.num_chunks, 4 * self.hidden_size], -1)
        master_forget = cumax(master_forget).unsqueeze(-1)
        master_input = 1.0 - cumax(master_input).unsqueeze(-1)
        forget, input_, output, candidate = gates.view(-1, 4, self.num_chunks, self.chunk_size).unbind(1)
        overlap = master_forget * master_input
        forget = torch.sigmoid(forget) * overlap + (master_forget - overlap)
        input_ = torch.sigmoid(input_) * overlap + (master_input - overlap)
        cell = forget * cell + input_ * torch.tanh(candidate)
        hidden = torch.sigmoid(output) * torch.tanh(cell)
        return hidden.flatten(1), cell


__all__ = ["OnLstm", "cumax"]
