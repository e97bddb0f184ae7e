"""ONNX export of MG-SA's recurrences (`phrase_recurrence.py`, `OnLstm.forward_padded`): the padded scans that
`torch.export` traces equal the packed eager recurrences (outputs, last states, zeros on padded slots) on ragged
batches; on the T5 backbone, the LSTM composition with the LSTM interaction exports with `export_generation_onnx`,
whose encoder graph runs them as ONNX `Scan`s, and gives PyTorch `generate`'s tokens through onnxruntime (greedy,
beam 4) on real test 2016 sentences (the default MG-SA, with its ON-LSTM interaction: test_onnx_generation.py)."""

import pytest
import torch
from conftest import MULTI30K, ONNX_EXPORT_LAYERS, assert_ort_generate_equals_pytorch, onnx_kinds
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from mgsa_hf import (
    MgsaForConditionalGeneration,
    MgsaT5ForConditionalGeneration,
    phrase_recurrence,
)
from mgsa_hf import phrase_partition as phrase_partition_module
from mgsa_hf.modeling_syntax_inputs import MgsaSyntaxInputs
from mgsa_hf.on_lstm import OnLstm
from mgsa_hf.phrase_recurrence import interaction_packed, interaction_padded, lstm_padded
from mgsa_hf.tokenization_utils import read_lines
from mgsa_hf.variant_phrase_memory import PhraseMemoryAttention, phrase_partition


pytestmark = pytest.mark.usefixtures("one_thread", "one_torchlib_registry", "uncached_fake_tensors")

# ragged lengths of 7 sequences over 9 steps: full, empty, one step, the rest in between
LENGTHS = torch.tensor([9, 3, 0, 1, 9, 5, 2])
MAX_NEW_TOKENS = 8


@pytest.fixture(scope="module")
def test_sources():
    """Five English sentences of Multi30k test 2016."""
    return list(read_lines(f"{MULTI30K}/test_2016_flickr.en.gz", 5))


def packed_reference(recurrence, inputs: torch.Tensor, lengths: torch.LongTensor):
    """The packed eager run of the non-empty sequences: outputs (N, T, H) zero-padded, h_T, c_T (N, H), empty
    sequences 0."""
    real = lengths > 0
    packed = pack_padded_sequence(inputs[real], lengths[real], batch_first=True, enforce_sorted=False)
    outputs, (hidden, cell) = recurrence(packed)
    outputs, _ = pad_packed_sequence(outputs, batch_first=True, total_length=inputs.shape[1])
    hidden, cell = hidden.reshape(-1, hidden.shape[-1]), cell.reshape(-1, cell.shape[-1])
    full = [outputs.new_zeros(len(lengths), *tensor.shape[1:]) for tensor in (outputs, hidden, cell)]
    for target, value in zip(full, (outputs, hidden, cell), strict=True):
        target[real] = value
    return full


@pytest.mark.parametrize("kind", ["on_lstm", "lstm"])
def test_padded_recurrence_equals_packed(kind):
    """`OnLstm.forward_padded` and `lstm_padded` (a scan over the padded batch) give the packed eager run's outputs,
    last hidden and cell states; outputs past a sequence's length and an empty sequence's states are 0."""
    torch.manual_seed(0)
    if kind == "on_lstm":
        recurrence = OnLstm(6, 12, 4)
        torch.nn.init.normal_(recurrence.hidden_gates.weight, std=0.5)
        padded = recurrence.forward_padded
    else:
        recurrence = torch.nn.LSTM(6, 12, batch_first=True)

        def padded(inputs, lengths):
            return lstm_padded(recurrence, inputs, lengths)

    inputs = torch.randn(len(LENGTHS), 9, 6)
    with torch.no_grad():
        outputs, (hidden, cell) = padded(inputs, LENGTHS)
        expected = packed_reference(recurrence, inputs, LENGTHS)
    for actual, reference in zip((outputs, hidden, cell), expected, strict=True):
        assert actual.shape == reference.shape
        torch.testing.assert_close(actual, reference, atol=1e-6, rtol=0)
    steps = torch.arange(9)
    assert (outputs[steps >= LENGTHS.unsqueeze(1)] == 0).all()
    assert (outputs[steps < LENGTHS.unsqueeze(1)] != 0).any(-1).all()  # the real steps are not vacuous zeros
    assert hidden.abs().amax(-1).gt(0).tolist() == (LENGTHS > 0).tolist()
    # a sequence's last state is its output at its last step, not at the padded end
    torch.testing.assert_close(hidden[1], outputs[1, 2], atol=0, rtol=0)


def processor_syntax(processor, sources: list[str]) -> tuple[dict, MgsaSyntaxInputs]:
    batch = processor(sources, return_tensors="pt")
    return batch, MgsaSyntaxInputs(padding_mask=batch["attention_mask"].bool(), phrase_ids=batch["phrase_ids"])


@pytest.mark.parametrize("interaction", ["on_lstm", "lstm"])
def test_padded_interaction_equals_packed(interaction, multi30k_processor, tiny_config, test_sources):
    """REC (Eq. 11) over the phrase sequences of every granularity of a real processor batch: the padded scan gives
    the packed run's memory, (B, G, P, d_m) with padded phrase slots 0."""
    torch.manual_seed(0)
    config = tiny_config(multi30k_processor, "phrase_memory", phrase_interaction=interaction)
    attention = PhraseMemoryAttention(config, config.encoder_attention_heads, layer_idx=0).eval()
    _, syntax = processor_syntax(multi30k_processor, test_sources)
    partition = phrase_partition(config, syntax)
    hidden = torch.randn(*syntax.padding_mask.shape, config.d_model)
    with torch.no_grad():
        phrases = attention.composition(hidden, partition)
        batch_size, num_granularities, num_phrases, dim = phrases.shape
        lengths = (partition.phrase_ids.amax(-1) + 1).flatten()
        assert len(set(lengths.tolist())) > 3 and int(lengths.max()) == num_phrases  # ragged
        sequences = phrases.reshape(-1, num_phrases, dim)
        expected = interaction_packed(attention.interaction, sequences, lengths)
        actual = interaction_padded(attention.interaction, sequences, lengths)
        assert torch.equal(attention.interact(phrases, partition).flatten(0, 1), expected)  # the eager path
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)
    real = torch.arange(num_phrases) < lengths.unsqueeze(1)
    assert (actual[~real] == 0).all() and (actual[real] != 0).any(-1).all()


@pytest.mark.parametrize("partition_type", ["syntactic", "ngram"])
def test_padded_lstm_composition_equals_packed(partition_type, multi30k_processor, tiny_config, test_sources,
                                               monkeypatch):
    """COM = LSTM (Eq. 8) over a real batch's phrases: the scan over word steps (selected when `torch.export`
    traces) gives the packed run's last state of every phrase, and 0 for empty phrase slots."""
    torch.manual_seed(0)
    fields = {"phrase_partition": partition_type, "phrase_composition": "lstm", "phrase_interaction": "none"}
    if partition_type == "ngram":
        fields["phrase_tag_supervision"] = False
    config = tiny_config(multi30k_processor, "phrase_memory", **fields)
    composition = PhraseMemoryAttention(config, config.encoder_attention_heads, layer_idx=0).composition
    _, syntax = processor_syntax(multi30k_processor, test_sources)
    partition = phrase_partition(config, syntax)
    hidden = torch.randn(*syntax.padding_mask.shape, config.d_model)
    calls = []
    monkeypatch.setattr(composition, "last_states_padded", spy(composition.last_states_padded, calls))
    with torch.no_grad():
        expected = composition(hidden, partition)
        assert not calls  # eager: the packed run
        monkeypatch.setattr(phrase_recurrence, "is_exporting", lambda: True)
        actual = composition(hidden, partition)
        assert len(calls) == 1
    assert partition.segment_lengths[..., :-1].unique().numel() > 2  # phrases of several lengths
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)
    assert (actual[~partition.phrase_mask] == 0).all() and (actual[partition.phrase_mask] != 0).any(-1).all()
    # the export's token order (ONNX has no stable sort) is the stable sort's
    monkeypatch.setattr(phrase_partition_module, "is_exporting", lambda: True)
    assert torch.equal(phrase_partition(config, syntax).token_order, partition.token_order)


def spy(function, calls: list):
    def wrapper(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)

    return wrapper


# (backbone, variant fields): the LSTM composition and interaction on T5 (the default MG-SA, its ON-LSTM
# interaction on Marian, runs the whole generation suite in test_onnx_generation.py)
MODELS = {
    "t5-lstm-lstm": ("t5", {"phrase_composition": "lstm", "phrase_interaction": "lstm"}),
}


@pytest.fixture(scope="module", params=onnx_kinds(MODELS))
def exported(request, multi30k_processor, tiny_config, tiny_t5_config, tmp_path_factory):
    """A tiny random recurrent MG-SA model of each kind, exported once: `(PyTorch model, ONNX Runtime model,
    folder)`."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from mgsa_hf.export.onnx_generation import OrtMgsaForConditionalGeneration, export_generation_onnx

    backbone, fields = MODELS[request.param]
    fields = {**ONNX_EXPORT_LAYERS[backbone], **fields}
    torch.manual_seed(0)
    if backbone == "marian":
        model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "phrase_memory", init_std=0.2, **fields))
    else:
        model = MgsaT5ForConditionalGeneration(tiny_t5_config(multi30k_processor, "phrase_memory", **fields))
    model.eval()
    folder = export_generation_onnx(model, tmp_path_factory.mktemp(request.param), processor=multi30k_processor)
    return model, OrtMgsaForConditionalGeneration.from_pretrained(folder, threads=1), folder


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
def test_recurrent_mgsa_ort_generate_equals_pytorch(exported, num_beams, multi30k_processor, test_sources):
    import onnx

    model, ort_model, folder = exported
    config = model.config
    expected_scans = (config.phrase_composition == "lstm") + (config.phrase_interaction != "none")
    encoder = onnx.load(folder / "encoder_model.onnx")
    operators = [node.op_type for node in encoder.graph.node]
    operators += [node.op_type for function in encoder.functions for node in function.node]
    assert operators.count("Scan") == expected_scans * len(config.phrase_memory_layers)
    batch = multi30k_processor(test_sources, return_tensors="pt")
    assert_ort_generate_equals_pytorch(model, ort_model, batch, MAX_NEW_TOKENS, num_beams=num_beams)
