"""Hybrid local/global attention (encoder_type="hybrid"): the gate limits against plain attention, the band of the
local pattern, parameter counts, the paper-row configs (training, padding invariance, beam search) and the gate
analysis of the paper's Figures 3 and 4."""

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_DIR, tiny_sizes

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration
from mgsa_hf.evaluation.analysis import (
    UNIVERSAL_TAGS,
    GateStatistics,
    hybrid_gate_statistics,
    plot_gate_statistics,
    word_universal_tags,
)
from mgsa_hf.modeling_attention import MgsaAttention
from mgsa_hf.modeling_syntax_inputs import MgsaSyntaxInputs
from mgsa_hf.variant_hybrid import HybridAttention


CONFIG_DIR = Path(__file__).resolve().parents[1] / "src" / "mgsa_hf" / "rows" / "hybrid"
ROWS = sorted(path.stem for path in CONFIG_DIR.glob("*.json"))
TINY = tiny_sizes(max_position_embeddings=256)


NEW_MODULES = ("gate_proj", "local_output_proj")


pytestmark = pytest.mark.usefixtures("one_thread")


def hybrid_config(row: str | None = None, **kwargs) -> MgsaConfig:
    fields = json.loads((CONFIG_DIR / f"{row}.json").read_text()) if row else {"encoder_type": "hybrid"}
    return MgsaConfig(**{**TINY, **fields, **kwargs})


def padded_inputs(lengths=(7, 4), width=7, seed=0):
    generator = torch.Generator().manual_seed(seed)
    padding_mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    hidden = torch.randn(len(lengths), width, 32, generator=generator)
    additive = torch.zeros(len(lengths), 1, width, width).masked_fill(
        ~padding_mask[:, None, None], torch.finfo(torch.float).min
    )
    return hidden, padding_mask, additive


def paired_attention(gate_bias: float, **config_kwargs):
    """A hybrid attention with a constant gate σ(gate_bias), and plain attention with the same projections."""
    torch.manual_seed(0)
    config = hybrid_config(attn_implementation="eager", **config_kwargs)
    hybrid = HybridAttention(config, 4, layer_idx=0).eval()
    with torch.no_grad():
        hybrid.gate_proj.weight.zero_()
        hybrid.gate_proj.bias.fill_(gate_bias)
    plain = MgsaAttention(config, 4, layer_idx=0).eval()
    plain.load_state_dict(hybrid.state_dict(), strict=False)
    return hybrid, plain


def test_gate_zero_is_plain_attention():
    hybrid, plain = paired_attention(-1e4)  # σ = 0 exactly
    hidden, padding_mask, additive = padded_inputs()
    syntax = MgsaSyntaxInputs(padding_mask=padding_mask)
    actual, _, contribution = hybrid(hidden, attention_mask=additive, syntax=syntax)
    expected, _, _ = plain(hidden, attention_mask=additive)
    assert torch.equal(actual[padding_mask], expected[padding_mask])
    assert torch.equal(contribution.gates, torch.zeros(2, 7))
    # against the SDPA kernel too, to float tolerance
    plain.config._attn_implementation = "sdpa"
    torch.testing.assert_close(actual[padding_mask], plain(hidden, attention_mask=additive)[0][padding_mask])


def test_gate_one_with_window_over_the_sentence_is_plain_attention():
    hidden, padding_mask, additive = padded_inputs()
    hybrid, plain = paired_attention(1e4, hybrid_window=7)  # σ = 1 exactly, m ≥ L
    actual, _, _ = hybrid(hidden, syntax=MgsaSyntaxInputs(padding_mask=padding_mask))
    expected, _, _ = plain(hidden, attention_mask=additive)
    torch.testing.assert_close(actual[padding_mask], expected[padding_mask], atol=1e-6, rtol=1e-6)
    # not vacuous: with m = 1 the local pattern differs from the global one
    narrow, _ = paired_attention(1e4, hybrid_window=1)
    local, _, _ = narrow(hidden, syntax=MgsaSyntaxInputs(padding_mask=padding_mask))
    assert (local - expected)[padding_mask].abs().max() > 1e-2


def test_local_combination_is_the_local_pattern_alone():
    """`hybrid_combination="local"` (Table 1's "+LOCAL PATTERN"): no new parameters, and the output of a gate fixed
    at 1 (σ = 1), in the fused and the eager path."""
    hidden, padding_mask, _ = padded_inputs()
    gated, _ = paired_attention(1e4)
    torch.manual_seed(0)
    local = HybridAttention(hybrid_config(hybrid_combination="local", attn_implementation="eager"), 4).eval()
    assert not any(name.startswith(NEW_MODULES) for name, _ in local.named_parameters())
    local.load_state_dict(gated.state_dict(), strict=False)
    expected, _, _ = gated(hidden, syntax=MgsaSyntaxInputs(padding_mask=padding_mask))
    actual, weights, contribution = local(hidden, syntax=MgsaSyntaxInputs(padding_mask=padding_mask))
    assert contribution.gates is None
    torch.testing.assert_close(actual[padding_mask], expected[padding_mask])
    assert weights is not None and (weights[..., 0, 3:] == 0).all()  # nothing outside |i - j| <= 1
    local.config._attn_implementation = "sdpa"
    fused, no_weights, _ = local(hidden, syntax=MgsaSyntaxInputs(padding_mask=padding_mask))
    torch.testing.assert_close(fused[padding_mask], expected[padding_mask], atol=1e-6, rtol=1e-5)
    assert no_weights is None


def test_concat_is_the_output_projection_of_global_and_local():
    """`"concat"`: W_O [global ; local] + b, the plain attention's output (W_O global + b) plus the local pattern's
    context through W_O^l, in the eager and the fused path."""
    hidden, padding_mask, additive = padded_inputs()
    syntax = MgsaSyntaxInputs(padding_mask=padding_mask)
    torch.manual_seed(0)
    concat = HybridAttention(hybrid_config(hybrid_combination="concat", attn_implementation="eager"), 4).eval()
    plain = MgsaAttention(concat.config, 4).eval()
    plain.load_state_dict(concat.state_dict(), strict=False)
    local = HybridAttention(hybrid_config(hybrid_combination="local", attn_implementation="eager"), 4).eval()
    local.load_state_dict(concat.state_dict(), strict=False)
    with torch.no_grad():
        local.output_proj.weight.copy_(concat.local_output_proj.weight)
        local.output_proj.bias.zero_()
    expected = plain(hidden, attention_mask=additive)[0] + local(hidden, syntax=syntax)[0]
    actual = concat(hidden, syntax=syntax)[0]
    torch.testing.assert_close(actual[padding_mask], expected[padding_mask])
    concat.config._attn_implementation = "sdpa"
    torch.testing.assert_close(concat(hidden, syntax=syntax)[0][padding_mask], expected[padding_mask], atol=1e-6,
                               rtol=1e-5)
    # not vacuous: the local half contributes
    assert (actual - plain(hidden, attention_mask=additive)[0])[padding_mask].abs().max() > 1e-2


def test_local_pattern_is_zero_outside_the_window():
    torch.manual_seed(0)
    attention = HybridAttention(hybrid_config(hybrid_window=1), 4, layer_idx=0)
    query, key = torch.randn(2, 2, 4, 9, 8).unbind(0)
    padding_mask = torch.arange(9)[None, :] < torch.tensor([[9], [6]])
    global_weights, local_weights = attention.attention_distributions(query, key, padding_mask)
    positions = torch.arange(9)
    band = (positions[:, None] - positions[None, :]).abs() <= 1
    allowed = band & padding_mask[:, None, None, :]
    real_rows = padding_mask[:, None, :, None].expand(-1, 4, -1, 9)
    assert torch.all(local_weights[real_rows & ~allowed] == 0)
    assert torch.all(local_weights[real_rows & allowed] > 0)
    torch.testing.assert_close(local_weights.sum(-1), torch.ones(2, 4, 9))
    assert torch.all(global_weights[real_rows & ~band & padding_mask[:, None, None, :]] > 0)
    assert torch.all(global_weights[:, :, :, 6:][1] == 0)  # padding keys

    # through the module with gate ≡ 1: a token's output depends on its neighbours only
    hybrid, _ = paired_attention(1e4, hybrid_window=1)
    hidden = torch.randn(1, 9, 32)
    changed = hidden.clone()
    changed[0, 8] = torch.randn(32)
    syntax = MgsaSyntaxInputs(padding_mask=torch.ones(1, 9, dtype=torch.bool))
    before, after = hybrid(hidden, syntax=syntax)[0], hybrid(changed, syntax=syntax)[0]
    assert torch.equal(before[0, :7], after[0, :7]) and not torch.equal(before[0, 7], after[0, 7])


@pytest.mark.parametrize(
    "kwargs, extra",
    [
        ({"hybrid_gate": "token"}, 32 + 1),
        ({"hybrid_gate": "head"}, 4 * (32 + 1)),
        ({"hybrid_combination": "concat"}, 32 * 32),  # the output projection's local half, W_O^l
    ],
)
def test_extra_parameters_per_layer(kwargs, extra):
    config = hybrid_config(**kwargs)
    hybrid, plain = HybridAttention(config, 4), MgsaAttention(config, 4)
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    assert count(hybrid) - count(plain) == extra
    model_extra = count(MgsaForConditionalGeneration(config)) - count(
        MgsaForConditionalGeneration(hybrid_config(encoder_type="transformer"))
    )
    assert model_extra == extra * len(config.hybrid_layers)


@pytest.mark.parametrize("gate, shape", [("token", (2, 7)), ("head", (2, 4, 7))])
def test_output_gates(gate, shape):
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(hybrid_config(hybrid_gate=gate)).eval()
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10, 0], [11, 12, 13, 0, 1, 1, 1]])
    labels = torch.tensor([[3, 4, 0]] * 2)
    output = model(input_ids=input_ids, attention_mask=input_ids.ne(1).long(), labels=labels, output_gates=True)
    assert len(output.encoder_gates) == 2 and all(g.shape == shape for g in output.encoder_gates)
    assert all(((g > 0) & (g < 1)).all() for g in output.encoder_gates)
    # the recorded gates are σ(W H_i) of the layer's input
    attention = model.get_encoder().layers[1].self_attn
    inputs = []
    attention.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    model(input_ids=input_ids, attention_mask=input_ids.ne(1).long(), labels=labels)
    expected = torch.sigmoid(attention.gate_proj(inputs[0]))
    expected = expected.transpose(1, 2) if gate == "head" else expected.squeeze(-1)
    torch.testing.assert_close(output.encoder_gates[1], expected)
    assert model(input_ids=input_ids, labels=labels).encoder_gates is None


@pytest.fixture(scope="module")
def real_batches(multi30k_processor, multi30k_val):
    """A padded batch of 6 Multi30k val sentence pairs, and each of its sources alone."""
    sources, targets = (sentences[:6] for sentences in multi30k_val)
    batch = multi30k_processor(sources, text_target=targets, return_tensors="pt")
    return batch, [multi30k_processor([text], return_tensors="pt") for text in sources]


def source_inputs(batch):
    return {name: value for name, value in batch.items() if name != "labels"}


def real_config(processor, row=None, **kwargs):
    special = dict(vocab_size=len(processor.tokenizer), pad_token_id=2, decoder_start_token_id=2, eos_token_id=0)
    return hybrid_config(row, **special, **kwargs)


@pytest.mark.parametrize("row", ROWS)
def test_config_rows_train(row, multi30k_processor, real_batches):
    """Every config trains on a real Multi30k batch: finite loss, gradients on every new parameter."""
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(real_config(multi30k_processor, row, encoder_layers=6)).train()
    output = model(**real_batches[0])
    assert torch.isfinite(output.loss)
    output.loss.backward()
    layers = [i for i, layer in enumerate(model.get_encoder().layers) if isinstance(layer.self_attn, HybridAttention)]
    assert layers == model.config.variant_layers
    new = {name: p for name, p in model.named_parameters() if any(m in name.split(".") for m in NEW_MODULES)}
    # the local pattern alone (+LOCAL PATTERN) adds no parameters; the gate and concat rows do
    assert bool(new) == (bool(layers) and model.config.hybrid_combination != "local")
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in new.values())


@pytest.mark.parametrize("row", ["gate", "concat", "gate_per_head"])
def test_padding_invariance(row, multi30k_processor, real_batches):
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(real_config(multi30k_processor, row)).eval()
    encoder = model.get_encoder()
    batch, singles = real_batches
    with torch.no_grad():
        batched = encoder(**source_inputs(batch))
        for row_index, single in enumerate(singles):
            alone = encoder(**single)
            length = alone.last_hidden_state.shape[1]
            assert batch["attention_mask"][row_index].sum() == length
            torch.testing.assert_close(
                batched.last_hidden_state[row_index, :length], alone.last_hidden_state[0], atol=1e-4, rtol=1e-4
            )
            if alone.gates is not None:
                torch.testing.assert_close(batched.gates[0][row_index, ..., :length], alone.gates[0][0])
    assert batch["attention_mask"].eq(0).any()  # not vacuous: the batch is padded


@pytest.mark.parametrize("row", ["gate", "concat"])
def test_generate_with_beams(row, multi30k_processor, real_batches):
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(real_config(multi30k_processor, row)).eval()
    batch, singles = real_batches
    generated = model.generate(**source_inputs(batch), num_beams=4, max_new_tokens=6, do_sample=False)
    assert generated.shape[0] == 6 and generated.shape[1] > 1
    # beam search over the padded batch gives what it gives for each sentence alone
    for index in (0, 5):
        alone = model.generate(**singles[index], num_beams=4, max_new_tokens=6, do_sample=False)
        assert generated[index, : alone.shape[1]].tolist() == alone[0].tolist()


def test_gate_statistics_aggregation():
    statistics = GateStatistics.empty([0, 1])
    # two sentences; words tagged NOUN VERB / DET NOUN; the third token of sentence 0 is a second subword of word 1;
    # EOS (word id = number of words) and padding (-1) are left out
    word_ids = torch.tensor([[0, 1, 1, 2], [0, 1, 2, -1]])
    gates = (torch.tensor([[0.1, 0.2, 0.4, 0.9], [0.3, 0.5, 0.9, 0.9]]), torch.full((2, 4), 0.5))
    statistics.update(gates, word_ids, [["NOUN", "VERB"], ["DET", "NOUN"]])
    assert statistics.token_counts[UNIVERSAL_TAGS.index("NOUN")] == 2
    means = statistics.tag_means()
    assert means == pytest.approx({"NOUN": 0.3, "VERB": 0.3, "DET": 0.3})
    assert statistics.layer_means() == pytest.approx({0: (0.1 + 0.2 + 0.4 + 0.3 + 0.5) / 5, 1: 0.5})
    # per-head gates are averaged over heads
    head_gates = tuple(gate[:, None].expand(2, 3, 4) for gate in gates)
    other = GateStatistics.empty([0, 1])
    other.update(head_gates, word_ids, [["NOUN", "VERB"], ["DET", "NOUN"]])
    torch.testing.assert_close(other.gate_sums, statistics.gate_sums)


def test_gate_statistics_on_real_sentences(tmp_path, multi30k_processor, multi30k_val, real_batches):
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(real_config(multi30k_processor, "gate", encoder_layers=3)).eval()
    sources = multi30k_val[0][:6]
    statistics = hybrid_gate_statistics(model, multi30k_processor, sources, batch_size=4)
    # the counts are the word tokens of the sentences, tagged from the parse
    batch = source_inputs(real_batches[0])
    tags = [word_universal_tags(multi30k_processor.syntax(text)) for text in sources]
    assert {"NOUN", "DET", "ADP", "VERB"} <= {tag for sentence in tags for tag in sentence}
    words = sum(int(((ids >= 0) & (ids < len(t))).sum()) for ids, t in zip(batch["word_ids"], tags, strict=True))
    assert statistics.token_counts.sum() == words
    # the layer means are those of the model's own gates over those tokens
    output = model(**batch, decoder_input_ids=torch.full((6, 1), 2), output_gates=True)
    is_word = torch.stack([(ids >= 0) & (ids < len(t)) for ids, t in zip(batch["word_ids"], tags, strict=True)])
    expected = {layer: gate[is_word].mean().item() for layer, gate in zip([0, 1], output.encoder_gates, strict=True)}
    assert statistics.layer_means() == pytest.approx(expected, abs=1e-6)
    noun = UNIVERSAL_TAGS.index("NOUN")
    assert statistics.tag_means()["NOUN"] == pytest.approx(
        (statistics.gate_sums[0, noun] / statistics.token_counts[noun]).item()
    )
    plot_gate_statistics(statistics, tmp_path / "gates.png")
    assert (tmp_path / "gates.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="hybrid_combination"):
        hybrid_gate_statistics(MgsaForConditionalGeneration(real_config(multi30k_processor, "concat")), None, [])


@pytest.mark.parametrize(
    "fields", [{}, {"hybrid_gate": "head"}, {"hybrid_combination": "concat"}, {"hybrid_window": 3}]
)
def test_fused_path_matches_the_explicit_distributions(fields):
    """SDPA for the global pattern and the banded local pattern give what the explicit (B, H, L, L) distributions
    give, on a padded batch, for both backbones' position handling (T5 adds a relative bias to the energy)."""
    torch.manual_seed(0)
    explicit = HybridAttention(hybrid_config(attn_implementation="eager", **fields), 4, layer_idx=0).eval()
    fused = HybridAttention(hybrid_config(attn_implementation="sdpa", **fields), 4, layer_idx=0).eval()
    fused.load_state_dict(explicit.state_dict())
    hidden, padding_mask, _ = padded_inputs(lengths=(9, 5), width=9)
    # the local pattern as a masked kernel (9 tokens) and, for longer sentences, from each window's keys
    assert fused.fused_local_max_length >= 9
    for fused_local_max_length in (fused.fused_local_max_length, 8):
        fused.fused_local_max_length = fused_local_max_length
        for position_bias in (None, torch.randn(1, 4, 9, 9)):
            expected, weights, _ = explicit(hidden, syntax=MgsaSyntaxInputs(padding_mask=padding_mask),
                                            position_bias=position_bias)
            actual, no_weights, _ = fused(hidden, syntax=MgsaSyntaxInputs(padding_mask=padding_mask),
                                          position_bias=position_bias)
            torch.testing.assert_close(actual[padding_mask], expected[padding_mask], atol=1e-5, rtol=1e-5)
            assert weights.shape == (2, 4, 9, 9) and no_weights is None


def test_the_banded_local_pattern_keeps_the_values_dtype_when_softmax_runs_in_fp32(monkeypatch):
    """CUDA autocast runs softmax in fp32 while the projections give bf16 (CPU autocast does not, so it is imitated
    here): the banded local context still comes out in the values' dtype, which Eq. 4's gate needs (lerp takes one
    dtype). Found training Transformer-base in bf16 on a GPU, on sentences past `fused_local_max_length`."""
    import mgsa_hf.variant_hybrid as variant_hybrid

    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(variant_hybrid.nn.functional, "softmax", lambda x, dim: softmax(x.float(), dim=dim))
    torch.manual_seed(0)
    attention = HybridAttention(hybrid_config(attn_implementation="sdpa"), 4, layer_idx=0).eval().bfloat16()
    attention.fused_local_max_length = 4
    hidden, padding_mask, _ = padded_inputs(lengths=(9, 5), width=9)
    output, _, contribution = attention(hidden.bfloat16(), syntax=MgsaSyntaxInputs(padding_mask=padding_mask))
    assert output.dtype == torch.bfloat16 and output.isfinite().all()
    assert contribution.gates.dtype == torch.bfloat16


def test_configs_readme_maps_every_file_with_its_parameter_count():
    """Every row file has a row in `rows/hybrid/README.md`, whose "package" column is the number of parameters
    the row adds to the Transformer at base size (d_model 512, 8 heads), as counted here."""
    readme = (CONFIG_DIR / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("|") and ".json`" in line]
    listed = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        files, package = cells[2], cells[4]
        for name in re.findall(r"`([\w-]+)\.json`", files):
            listed[name] = int(re.match(r"\+([\d,]+)", package).group(1).replace(",", ""))
    assert sorted(listed) == ROWS
    base = dict(d_model=512, encoder_attention_heads=8, decoder_attention_heads=8, encoder_layers=6)
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    for name, extra in listed.items():
        config = hybrid_config(name, **base)
        added = 0
        if config.encoder_type == "hybrid":
            added = len(config.hybrid_layers) * (count(HybridAttention(config, 8)) - count(MgsaAttention(config, 8)))
        assert added == extra, name


def test_a_concat_checkpoint_in_the_earlier_layout_is_refused(tmp_path):
    """A "concat" checkpoint with the earlier separate `concat_proj` cannot load into the current layer without
    changing its function (the upgrade path would start `local_output_proj` at 0 and drop `concat_proj`): a clear
    error naming the key, not a silently different model."""
    from safetensors.torch import load_file, save_file

    MgsaForConditionalGeneration(hybrid_config("concat", vocab_size=50, pad_token_id=2)).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    for name in [name for name in weights if name.endswith("local_output_proj.weight")]:
        prefix = name.removesuffix("local_output_proj.weight")
        weights[f"{prefix}concat_proj.weight"] = torch.cat([torch.eye(32), weights.pop(name)], dim=1)
        weights[f"{prefix}concat_proj.bias"] = torch.zeros(32)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "weights.sha256").unlink()  # saved before the record existed
    with pytest.raises(ValueError, match=r"earlier layout.*layers\.0\.self_attn\.concat_proj"):
        MgsaForConditionalGeneration.from_pretrained(tmp_path)


def test_a_hybrid_model_trains_and_serves_without_spacy(tmp_path):
    """Hybrid attention reads no syntax field (as the transformer and n-gram MG-SA): `mgsa-hf train` saves a
    processor that only tokenizes, and the run and the translation pipeline never import spaCy."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    script = f"""
import sys
from transformers import pipeline
from mgsa_hf.training import load_train_config, train
config = load_train_config({str(repo / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml")!r}, [
    "data={MULTI30K_DIR}", "output_dir={tmp_path / "model"}",
    "model.encoder_type=hybrid", "training.max_steps=2", "training.eval_strategy=no", "training.save_strategy=no"])
train(config)
print(pipeline("translation", model={str(tmp_path / "model")!r}, device="cpu")("A dog runs.")[0]["translation_text"])
assert "spacy" not in sys.modules, "spaCy was imported"
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "model" / "processor_config.json").read_text())["with_syntax"] is False
    assert not MgsaConfig(encoder_type="hybrid").reads_source_syntax
    assert not MgsaConfig(encoder_type="phrase_memory", phrase_partition="ngram",
                          phrase_tag_supervision=False).reads_source_syntax
    assert MgsaConfig(encoder_type="rhe").reads_source_syntax
    assert MgsaConfig(encoder_type="phrase_memory").reads_source_syntax
