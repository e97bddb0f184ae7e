"""ONNX export of the whole model (`mgsa_hf.export.export_onnx`): onnxruntime's logits equal PyTorch's on real
processor batches, at the batch size and lengths the graph was traced with and at others, for the plain model, T5 and
RHE (every encoder type's modules export as generation graphs in `test_onnx_generation.py`); the graph takes exactly
the syntax fields its encoder reads; settings that cannot export and bad examples get clear errors."""

import json
import runpy
from pathlib import Path

import pytest
import torch
from conftest import ONNX_EXPORT_LAYERS, onnx_kinds

from mgsa_hf import MgsaForConditionalGeneration, MgsaT5Config, MgsaT5ForConditionalGeneration
from mgsa_hf.export import export_onnx, onnx_input_names, onnx_inputs


ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

pytestmark = pytest.mark.usefixtures("one_thread", "one_torchlib_registry", "uncached_fake_tensors")

REPO = Path(__file__).resolve().parents[1]
TOKENS = ["input_ids", "attention_mask", "decoder_input_ids"]
# variant -> (config fields, the syntax inputs its graph must take); the syntax-reading form of each variant
MARIAN_VARIANTS = {
    "transformer": ({"encoder_type": "transformer"}, []),
    # every other encoder type exports as generation graphs (test_onnx_generation.py, MG-SA's ON-LSTM Scan in
    # test_onnx_recurrent.py), which trace the same modules; the whole-model graph is checked on the plain model, on
    # T5 (`test_onnx_t5_backbone`) and on RHE's five syntax inputs (`test_export_script`)
}  # RHE: through the script (`test_export_script`)
RHE_INPUTS = ["word_ids", "head_word_ids", "local_phrase_start", "local_phrase_end", "tree_depth"]


@pytest.fixture(scope="module")
def batches(multi30k_processor, multi30k_val):
    """Two real processor batches (spaCy syntax fields included): 4 pairs to trace with, and 7 others, so that the
    batch size, the source length and the target length all differ."""
    sources, targets = multi30k_val
    example = dict(multi30k_processor(sources[:4], text_target=targets[:4], return_tensors="pt"))
    other = dict(multi30k_processor(sources[4:11], text_target=targets[4:11], return_tensors="pt"))
    for name in ("input_ids", "labels"):
        assert example[name].shape[0] != other[name].shape[0] and example[name].shape[1] != other[name].shape[1]
    return example, other


def assert_onnx_matches_pytorch(model, path, batches):
    """onnxruntime's logits of the graph at `path` equal the model's on both batches (atol 1e-4)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [graph_input.name for graph_input in session.get_inputs()]
    assert names == onnx_input_names(model.config)
    for batch in batches:
        batch = dict(batch)
        batch["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(batch.pop("labels"))
        with torch.no_grad():
            expected = model(**batch).logits
        actual = torch.from_numpy(session.run(None, onnx_inputs(batch, names))[0])
        assert actual.shape == expected.shape == (*batch["decoder_input_ids"].shape, model.config.vocab_size)
        torch.testing.assert_close(actual, expected, atol=1e-4, rtol=0)
        assert expected.std() > 0.1  # the logits vary: the comparison is not vacuous
    return names


@pytest.mark.parametrize("variant", onnx_kinds(MARIAN_VARIANTS))
def test_onnx_logits_equal_pytorch(variant, multi30k_processor, tiny_config, batches, tmp_path):
    fields, syntax_inputs = MARIAN_VARIANTS[variant]
    config = tiny_config(multi30k_processor, **ONNX_EXPORT_LAYERS["marian"], **fields, init_std=0.2)
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(config).eval()
    path = export_onnx(model, tmp_path / "model.onnx", batches[0])
    assert path.is_file() and not model.training
    names = assert_onnx_matches_pytorch(model, path, batches)
    assert names == TOKENS + syntax_inputs


def test_onnx_t5_backbone(multi30k_processor, batches, tmp_path):
    """The T5 backbone exports as well: MG-SA's n-gram row (SANs composition, no interaction)."""
    tokenizer = multi30k_processor.tokenizer
    config = MgsaT5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=6, d_ff=48, num_layers=2, num_decoder_layers=1, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id, encoder_type="phrase_memory", phrase_partition="ngram",
        phrase_tag_supervision=False, phrase_interaction="none",
    )
    torch.manual_seed(0)
    model = MgsaT5ForConditionalGeneration(config).eval()
    path = export_onnx(model, tmp_path / "t5.onnx", batches[0])
    assert assert_onnx_matches_pytorch(model, path, batches) == TOKENS


def test_export_script(multi30k_processor, tiny_config, batches, tmp_path, capsys):
    """`scripts/export_onnx.py FOLDER OUTPUT` exports a saved folder, here RHE with its defaults (LPEA with
    redundant-head enlivening, which reads the dependencies and the local phrases), and checks the graph with
    onnxruntime."""
    config = tiny_config(multi30k_processor, "rhe", init_std=0.2)
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(config)
    model.save_pretrained(tmp_path / "model")
    multi30k_processor.save_pretrained(tmp_path / "model")
    script = runpy.run_path(str(REPO / "scripts" / "export_onnx.py"))
    script["main"]([str(tmp_path / "model"), str(tmp_path / "model.onnx")])
    report = json.loads(capsys.readouterr().out)
    assert report["inputs"] == TOKENS + RHE_INPUTS
    assert set(report["max_abs_logit_difference"]) == {"example batch", "smaller batch"}
    assert max(report["max_abs_logit_difference"].values()) < 1e-4
    assert assert_onnx_matches_pytorch(model.eval(), tmp_path / "model.onnx", batches) == TOKENS + RHE_INPUTS


@pytest.mark.parametrize("setting", [{"phrase_interaction": "on_lstm", "on_lstm_chunk_size": 2},
                                     {"phrase_composition": "lstm", "phrase_interaction": "none"}])
def test_recurrent_mgsa_needs_an_exporter_that_writes_scan(setting, multi30k_processor, tiny_config, batches,
                                                           tmp_path, monkeypatch):
    """MG-SA's recurrences export as ONNX `Scan`s: with an exporter that cannot write them, the recurrent settings are
    refused by name before tracing (the others still export)."""
    from mgsa_hf import export

    assert export.exporter_writes_scan()  # this torch's exporter writes them (the other tests export the default)
    monkeypatch.setattr(export, "exporter_writes_scan", lambda: False)
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "phrase_memory", **setting))
    name = next(key for key in setting if key.startswith("phrase_") and setting[key] != "none")
    with pytest.raises(ValueError, match=f"{name}=.*ONNX `Scan`.*cannot write"):
        export_onnx(model, tmp_path / "model.onnx", batches[0])
    assert not (tmp_path / "model.onnx").exists()
    export.check_onnx_exportable(tiny_config(multi30k_processor, "phrase_memory", phrase_interaction="none"))


def test_bad_examples_are_refused(multi30k_processor, tiny_config, batches, tmp_path):
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "rhe"))
    example = batches[0]
    one_sentence = {name: value[:1] for name, value in example.items()}
    with pytest.raises(ValueError, match="batch size 1.*at least 2 sentences"):
        export_onnx(model, tmp_path / "model.onnx", one_sentence)
    without_syntax = {name: example[name] for name in ("input_ids", "attention_mask", "labels")}
    with pytest.raises(ValueError, match=r"reads \['word_ids', 'head_word_ids', 'local_phrase_start'"):
        export_onnx(model, tmp_path / "model.onnx", without_syntax)
    without_target = {name: value for name, value in example.items() if name != "labels"}
    with pytest.raises(ValueError, match="`decoder_input_ids` or `labels`"):
        export_onnx(model, tmp_path / "model.onnx", without_target)
