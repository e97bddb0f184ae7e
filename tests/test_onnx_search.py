"""Generation as one onnxruntime call (`mgsa_hf.export.onnx_search`): for the Transformer, hybrid, n-gram MG-SA,
fixed-size PR and the types that read source syntax (syntactic MG-SA, RHE, PR), on the Marian backbone, and for the
T5 Transformer and RHE, the graph holding onnxruntime's `BeamSearch` gives PyTorch `generate`'s tokens (greedy, beam 4,
`num_return_sequences=2`) on real test 2016 sentences through the real processor (spaCy parses), with hypotheses
ending by EOS at many lengths; settings the op cannot reproduce and other model types are refused by name."""

import json

import pytest
import torch
from conftest import MULTI30K, ONNX_EXPORT_LAYERS, onnx_kinds
from transformers import GenerationConfig, T5Config, T5ForConditionalGeneration

from mgsa_hf import MgsaForConditionalGeneration, MgsaT5ForConditionalGeneration
from mgsa_hf.tokenization_utils import read_lines


ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

from mgsa_hf.export.onnx_generation import cpu_session_options  # noqa: E402
from mgsa_hf.export.onnx_search import (  # noqa: E402
    OrtSearchModel,
    check_search_onnxruntime,
    check_search_settings,
    export_search_onnx,
)


pytestmark = pytest.mark.usefixtures("one_thread", "one_torchlib_registry", "uncached_fake_tensors")


def test_an_older_onnxruntime_is_refused_by_name():
    """An onnxruntime that cannot load the search graph (1.20 cannot) is named with the release to install."""
    with pytest.raises(RuntimeError, match=r"needs onnxruntime>=1\.32 \(this is 1\.20\.1, which cannot load"):
        check_search_onnxruntime("1.20.1")
    check_search_onnxruntime("1.32.0")

NGRAM = {"phrase_partition": "ngram", "phrase_interaction": "none", "phrase_tag_supervision": False}
# (encoder type, config fields, generation settings beyond beam search's early stopping, the EOS logit's bias: a
# random model's hypotheses then end by EOS at many lengths, not only where `max_length` forces it)
MODELS = {
    "transformer": ("transformer", {}, {}, 2.0),
    # the op's vocabulary mask, n-gram blocking, minimum length and length penalty; exported from a saved folder
    "hybrid": ("hybrid", {}, {"bad_words_ids": [[5]], "suppress_tokens": [7], "no_repeat_ngram_size": 3,
                              "min_length": 3, "length_penalty": 0.8}, 3.0),
    "phrase_memory-ngram": ("phrase_memory", NGRAM, {}, 4.5),
    # the types that read source syntax: the processor's parse (spaCy) in the main graph's inputs. The default MG-SA
    # (syntactic phrases, tag supervision, the ON-LSTM interaction's scan); RHE's dependency and phrase fields
    "phrase_memory": ("phrase_memory", {}, {}, 3.0),
    "rhe": ("rhe", {}, {}, 5.5),
    # PR (its default, fixed-size phrases), two decoder layers: its phrase caches and mask ride in the token cross
    # caches, as they do with the parse's phrases, whose `pr_phrase_ids` are an input like MG-SA's `phrase_ids`
    # (wider initial weights: at 0.2 a random PR model says the same for every source)
    "phrase_representation": ("phrase_representation", {"init_std": 0.5, "decoder_layers": 2}, {}, 10.0),
}
# T5 rows: (encoder type, config fields, generation settings, the factor on the EOS embedding: T5's tied head has no
# bias, and a longer EOS row gives its logit the spread that ends hypotheses at many lengths). The decoder's relative
# position bias follows the cache length; the tied head is scaled by d_model^-0.5; the decoder starts from padding
T5_MODELS = {
    "t5-transformer": ("transformer", {}, {"no_repeat_ngram_size": 3}, 8.0),
    "t5-rhe": ("rhe", {}, {}, 8.0),
}
FROM_FOLDER = "hybrid"
MAX_NEW_TOKENS = 10


@pytest.fixture(scope="module")
def test_sources():
    """The first five English sentences of Multi30k test 2016 and its longest (51 tokens, past hybrid's fused local
    pattern)."""
    lines = list(read_lines(f"{MULTI30K}/test_2016_flickr.en.gz"))
    return lines[:5] + [max(lines, key=len)]


def tiny_model(processor, tiny_config, encoder_type: str, eos_bias: float = 0.0, **fields
               ) -> MgsaForConditionalGeneration:
    torch.manual_seed(0)
    config = tiny_config(processor, encoder_type, **{**ONNX_EXPORT_LAYERS["marian"], "init_std": 0.2, **fields})
    model = MgsaForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.final_logits_bias[0, config.eos_token_id] = eos_bias
    return model


def tiny_t5_model(processor, tiny_t5_config, encoder_type: str, eos_scale: float = 1.0, **fields
                  ) -> MgsaT5ForConditionalGeneration:
    torch.manual_seed(0)
    model = MgsaT5ForConditionalGeneration(tiny_t5_config(processor, encoder_type,
                                                          **{**ONNX_EXPORT_LAYERS["t5"], **fields})).eval()
    with torch.no_grad():
        model.shared.weight[model.config.eos_token_id] *= eos_scale
    return model


@pytest.fixture(scope="module", params=onnx_kinds({**MODELS, **T5_MODELS}))
def exported(request, multi30k_processor, tiny_config, tiny_t5_config, tmp_path_factory):
    """A tiny random model of each type, its generation config set for beam search, exported once:
    `(name, PyTorch model, OrtSearchModel, folder)`."""
    try:
        check_search_onnxruntime(ort.__version__)
    except RuntimeError as refused:  # an onnxruntime that cannot load the search graph
        pytest.skip(str(refused))
    name = request.param
    if name in T5_MODELS:
        encoder_type, fields, generation, eos_scale = T5_MODELS[name]
        model = tiny_t5_model(multi30k_processor, tiny_t5_config, encoder_type, eos_scale, **fields)
        assert model.config.scale_decoder_outputs  # the tied head's d_model^-0.5 scale is in the graphs
        assert model.generation_config.forced_eos_token_id is None  # T5 sets no forced EOS: beam search needs it
        generation = {"forced_eos_token_id": model.config.eos_token_id, **generation}
    else:
        encoder_type, fields, generation, eos_bias = MODELS[name]
        model = tiny_model(multi30k_processor, tiny_config, encoder_type, eos_bias, **fields)
        assert model.generation_config.forced_eos_token_id == model.config.eos_token_id  # the Marian default
    model.generation_config.update(num_beams=4, early_stopping=True, **generation)
    folder = tmp_path_factory.mktemp(name)
    if name == FROM_FOLDER:
        model.save_pretrained(folder / "model")
        multi30k_processor.save_pretrained(folder / "model")
        export_search_onnx(folder / "model", folder / "search")
    else:
        export_search_onnx(model, folder / "search", processor=multi30k_processor)
    return name, model, OrtSearchModel.from_pretrained(folder / "search", threads=1), folder / "search"


@pytest.mark.parametrize("settings", [{"num_beams": 1}, {"num_beams": 4}, {"num_beams": 4, "num_return_sequences": 2}],
                         ids=["greedy", "beam4", "beam4-return2"])
def test_one_call_equals_generate(exported, settings, multi30k_processor, test_sources):
    name, model, search, _ = exported
    batch = multi30k_processor(test_sources, return_tensors="pt")
    with torch.no_grad():
        expected = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, **settings)
    actual = search.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, **settings)
    assert actual.dtype == torch.long
    assert actual.shape == expected.shape
    assert torch.equal(actual, expected)
    # not vacuous: some hypotheses end by EOS before the last step, some run to `max_length`
    ends = (expected == model.config.eos_token_id).long().argmax(1)
    assert ends.min() < MAX_NEW_TOKENS and len(set(ends.tolist())) > 1


def test_graph_is_one_search_node(exported):
    """The main graph is the `BeamSearch` node (encoder-decoder form) over the two subgraphs, with the names and
    int32 inputs the op checks; the weights are stored once, in the main graph."""
    name, model, search, folder = exported
    graph = onnx.load(folder / "search_model.onnx").graph
    assert [(node.op_type, node.domain) for node in graph.node] == [("BeamSearch", "com.microsoft")]
    attributes = {attribute.name: attribute for attribute in graph.node[0].attribute}
    assert attributes["model_type"].i == 1 and attributes["early_stopping"].i == 1
    encoder, decoder = attributes["encoder"].g, attributes["decoder"].g
    assert [tensor.name for tensor in encoder.input] == ["encoder_input_ids", "encoder_attention_mask",
                                                         "decoder_input_ids"]
    assert [tensor.name for tensor in encoder.output][:4] == ["logits", "encoder_hidden_states", "present_key_self_0",
                                                               "present_value_self_0"]
    assert [tensor.name for tensor in decoder.input][:4] == ["input_ids", "encoder_attention_mask",
                                                             "encoder_hidden_states", "past_key_self_0"]
    # one key and one value per decoder layer each way, as the op checks (PR's phrase caches ride in them)
    layers = model.config.decoder_layers
    assert len(encoder.output) == 2 + 4 * layers and len(decoder.input) == 3 + 4 * layers
    assert {tensor.type.tensor_type.elem_type for tensor in [*encoder.input, *decoder.input[:2]]} == {
        onnx.TensorProto.INT32}
    assert not encoder.initializer and not decoder.initializer
    stored = sum(onnx.numpy_helper.to_array(tensor).size for tensor in graph.initializer)
    assert stored < 1.2 * sum(parameter.numel() for parameter in model.parameters())
    settings = json.loads((folder / "onnx_search.json").read_text())["settings"]
    generation = {**MODELS, **T5_MODELS}[name][2]
    masked = generation.get("bad_words_ids", []) + [[token] for token in generation.get("suppress_tokens", [])]
    assert settings["masked_tokens"] == sorted(token for (token,) in masked)
    assert settings["decoder_start_token_id"] == model.config.decoder_start_token_id  # T5: the pad token


def test_translate_and_bad_calls(exported, multi30k_processor, test_sources, tmp_path):
    name, model, search, folder = exported
    if name != "transformer":
        pytest.skip("checked on the Transformer")
    batch = multi30k_processor.tokenizer(test_sources, return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, num_beams=4)
    assert search.translate(multi30k_processor, test_sources, max_new_tokens=MAX_NEW_TOKENS, num_beams=4) == (
        multi30k_processor.tokenizer.batch_decode(expected, skip_special_tokens=True))
    with pytest.raises(ValueError, match=r"takes no \['do_sample'\]"):
        search.generate(**batch, do_sample=True)
    too_large = batch["input_ids"].clone()
    too_large[0, 0] = model.config.vocab_size
    with pytest.raises(ValueError, match="input_ids"):
        search.generate(too_large, batch["attention_mask"])
    with pytest.raises(ValueError, match="attention_mask has shape"):
        search.generate(batch["input_ids"], batch["attention_mask"][:, 1:])
    with pytest.raises(ValueError, match="target sequence has 1001 tokens"):
        search.generate(**batch, max_new_tokens=1000)
    with pytest.raises(ValueError, match="num_return_sequences <= num_beams"):
        search.generate(**batch, num_beams=2, num_return_sequences=3)
    # a folder exported without beam search's settings serves greedy search only
    greedy_only = OrtSearchModel(folder, search.session, search.config, {**search.settings, "beam_search": False})
    with pytest.raises(ValueError, match="early_stopping=True and forced_eos_token_id"):
        greedy_only.generate(**batch, num_beams=4)
    with pytest.raises(ValueError, match="not a folder written by `export_search_onnx`"):
        OrtSearchModel.from_pretrained(tmp_path)
    # session options are used as given, and not beside `threads`
    spinning = OrtSearchModel.from_pretrained(folder, session_options=cpu_session_options(1, spinning=True))
    assert spinning.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "1"
    with pytest.raises(ValueError, match="intra_op_num_threads"):
        OrtSearchModel.from_pretrained(folder, threads=1, session_options=cpu_session_options(1))


def test_refused_settings_are_named():
    config = GenerationConfig(do_sample=True, repetition_penalty=1.3, bad_words_ids=[[4, 5]], num_beams=4,
                              early_stopping=False, eos_token_id=0, forced_eos_token_id=0, pad_token_id=2,
                              decoder_start_token_id=2)
    with pytest.raises(ValueError) as error:
        check_search_settings(config)
    for setting in ("generation_config.do_sample=True", "generation_config.repetition_penalty=1.3",
                    "bad_words_ids entry [4, 5]", "num_beams=4 with early_stopping=False"):
        assert setting in str(error.value)
    without_forced_eos = GenerationConfig(num_beams=4, early_stopping=True, eos_token_id=0, pad_token_id=2,
                                          decoder_start_token_id=2)
    with pytest.raises(ValueError, match="forced_eos_token_id=None"):
        check_search_settings(without_forced_eos)
    greedy = check_search_settings(GenerationConfig(eos_token_id=0, pad_token_id=2, decoder_start_token_id=2,
                                                    bad_words_ids=[[2]], suppress_tokens=[9]))
    assert greedy["num_beams"] == 1 and not greedy["beam_search"] and greedy["masked_tokens"] == [2, 9]


def test_syntax_fields_are_graph_inputs(exported, multi30k_processor, test_sources):
    """A type that reads syntax takes the processor's fields in the main graph (the encoder subgraph reads them from
    there); `translate` runs the processor, and a batch without a field the encoder reads is refused by name."""
    name, model, search, folder = exported
    if name != "phrase_memory":
        pytest.skip("checked on the syntactic MG-SA")
    graph = onnx.load(folder / "search_model.onnx").graph
    assert [tensor.name for tensor in graph.input][-1] == "phrase_ids"
    assert json.loads((folder / "onnx_search.json").read_text())["syntax_fields"] == ["phrase_ids"]
    batch = multi30k_processor(test_sources, return_tensors="pt")
    with torch.no_grad():
        expected = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, num_beams=4)
    assert search.translate(multi30k_processor, test_sources, max_new_tokens=MAX_NEW_TOKENS, num_beams=4) == (
        multi30k_processor.tokenizer.batch_decode(expected, skip_special_tokens=True))
    with pytest.raises(ValueError, match="reads 'phrase_ids', which the inputs lack"):
        search.generate(batch["input_ids"], batch["attention_mask"])
    with pytest.raises(ValueError, match=r"phrase_ids has shape \(6, \d+, \d+\), input_ids"):
        search.generate(batch["input_ids"][:, 1:], batch["attention_mask"][:, 1:], phrase_ids=batch["phrase_ids"])
    with pytest.raises(ValueError, match="translate needs the model's `MgsaProcessor`"):
        search.translate(multi30k_processor.tokenizer, test_sources)


def test_other_model_types_are_refused(multi30k_processor, tmp_path):
    """A model of neither backbone (here transformers' own T5) is refused before any tracing, naming its type."""
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=len(multi30k_processor.tokenizer), d_model=16, d_kv=4,
                                             d_ff=16, num_layers=1, num_heads=2))
    with pytest.raises(ValueError, match="takes the Marian and T5 backbones, not 't5'"):
        export_search_onnx(t5, tmp_path / "t5", processor=multi30k_processor)
    assert not (tmp_path / "t5").exists()
