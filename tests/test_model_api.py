"""What transformers' own model tooling expects of the model classes, checked against its Marian and T5 models:
separate target vocabularies resize as `MarianMTModel`'s do, `_can_compile_fullgraph` says whether a model traces as
one graph, static-cache generation runs under `torch.compile(fullgraph=True)` with eager's output, and the forwards
type their `**kwargs` as `TransformersKwargs`."""

import inspect
import typing

import pytest
import torch
from transformers import MarianConfig, MarianMTModel
from transformers.generation import CompileConfig
from transformers.utils import TransformersKwargs

from mgsa_hf import MgsaForConditionalGeneration, MgsaT5ForConditionalGeneration
from mgsa_hf.modeling_mgsa import MgsaDecoder, MgsaEncoder, MgsaModel
from mgsa_hf.modeling_mgsa_t5 import MgsaT5Decoder, MgsaT5Encoder, MgsaT5Model


pytestmark = pytest.mark.usefixtures("one_thread")

PAD = 39
# a Marian model with a source vocabulary of 50 and a target vocabulary of 40
SEPARATE_VOCABULARIES = dict(
    vocab_size=50, decoder_vocab_size=40, share_encoder_decoder_embeddings=False, d_model=32, encoder_layers=2,
    decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
    max_position_embeddings=64, pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=0, forced_eos_token_id=0,
    init_std=0.2,
)
# a one-graph row of every encoder type (the default, but MG-SA's n-gram row), and MG-SA's default, the paper's final
# system, with the ON-LSTM recurrence over its phrases
ROWS = {
    "transformer": {},
    "phrase_memory": {"phrase_partition": "ngram", "phrase_tag_supervision": False, "phrase_interaction": "none"},
    "phrase_representation": {},
    "hybrid": {},
    "rhe": {},
}
RECURRENCE = ("phrase_memory", {})


@pytest.fixture(scope="module")
def marian_dirs(tmp_path_factory):
    """`MarianMTModel` folders with separate source and target vocabularies, the LM head tied to the target
    embeddings or not, and one with a shared vocabulary; `final_logits_bias` is random so that resizing it shows."""
    folders = {}
    for name, fields in {
        "separate, tied": {},
        "separate, untied": {"tie_word_embeddings": False},
        "shared": {"share_encoder_decoder_embeddings": True, "decoder_vocab_size": 50},
    }.items():
        torch.manual_seed(0)
        marian = MarianMTModel(MarianConfig(**{**SEPARATE_VOCABULARIES, **fields})).eval()
        torch.nn.init.normal_(marian.final_logits_bias, std=0.05)
        folders[name] = tmp_path_factory.mktemp("marian")
        marian.save_pretrained(folders[name])
    return folders


@pytest.fixture(scope="module")
def token_batch():
    input_ids = torch.tensor([[5, 6, 7, 8, 49, 0], [10, 11, 12, 0, PAD, PAD]])
    decoder_input_ids = torch.tensor([[PAD, 3, 4, 38], [PAD, 6, 7, 2]])
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(PAD).long(), "decoder_input_ids": decoder_input_ids}


def loaded_pair(folder):
    """The folder as `MarianMTModel` and as `MgsaForConditionalGeneration`, both in eval mode."""
    return MarianMTModel.from_pretrained(folder).eval(), MgsaForConditionalGeneration.from_pretrained(folder).eval()


def assert_same_as_marian(marian, model, token_batch):
    """The same target-side sizes and weights, and the same logits, as the `MarianMTModel`."""
    for field in ("vocab_size", "decoder_vocab_size"):
        assert getattr(model.config, field) == getattr(marian.config, field), field
    marian_weights = dict(marian.named_parameters(remove_duplicate=False))
    for name, weight in model.named_parameters(remove_duplicate=False):
        if name in marian_weights:
            torch.testing.assert_close(weight, marian_weights[name], msg=name)
    torch.testing.assert_close(model.final_logits_bias, marian.final_logits_bias)
    assert model.lm_head.weight.shape == marian.lm_head.weight.shape
    with torch.no_grad():
        torch.testing.assert_close(model(**token_batch).logits, marian(**token_batch).logits)


@pytest.mark.parametrize("tying", ["tied", "untied"])
@pytest.mark.parametrize("new_size", [46, 32])
def test_resize_decoder_token_embeddings_as_marian(marian_dirs, token_batch, tying, new_size):
    """Separate vocabularies: the target embeddings, the LM head (retied, or resized when untied),
    `final_logits_bias` and `config.decoder_vocab_size` take the new size as in `MarianMTModel`, with the same new
    rows (same seed) and logits, and the source side stays."""
    marian, model = loaded_pair(marian_dirs[f"separate, {tying}"])
    assert torch.equal(model.get_decoder_input_embeddings().weight, marian.model.get_decoder_input_embeddings().weight)
    source_embeddings = model.get_input_embeddings().weight.clone()
    for reference in (marian, model):
        torch.manual_seed(1)
        resized = reference.resize_decoder_token_embeddings(new_size)
        assert resized.weight.shape[0] == new_size
    assert model.config.decoder_vocab_size == new_size and model.final_logits_bias.shape == (1, new_size)
    assert model.get_decoder_input_embeddings() is model.model.decoder.embed_tokens
    assert (model.lm_head.weight is model.model.decoder.embed_tokens.weight) == (tying == "tied")
    torch.testing.assert_close(model.get_input_embeddings().weight, source_embeddings)
    batch = dict(token_batch, decoder_input_ids=token_batch["decoder_input_ids"].clamp(max=new_size - 1))
    assert_same_as_marian(marian, model, batch)


@pytest.mark.parametrize("vocabularies", ["separate, tied", "separate, untied", "shared"])
def test_resize_token_embeddings_as_marian(marian_dirs, token_batch, vocabularies):
    """The source side: with separate vocabularies only the source embeddings and `config.vocab_size` change (the
    LM head is the target side); with a shared one `config.decoder_vocab_size`, the LM head and `final_logits_bias`
    follow. The same weights and logits as `MarianMTModel` after the same resize."""
    marian, model = loaded_pair(marian_dirs[vocabularies])
    target_size = model.config.decoder_vocab_size
    for reference in (marian, model):
        torch.manual_seed(1)
        reference.resize_token_embeddings(56)
    assert model.config.vocab_size == 56
    expected_target_size = 56 if vocabularies == "shared" else target_size
    assert model.config.decoder_vocab_size == expected_target_size
    assert model.lm_head.weight.shape[0] == model.final_logits_bias.shape[-1] == expected_target_size
    assert_same_as_marian(marian, model, token_batch)


def test_decoder_embedding_methods_refuse_a_shared_vocabulary(marian_dirs):
    model = MgsaForConditionalGeneration.from_pretrained(marian_dirs["shared"])
    for call in (model.get_decoder_input_embeddings,
                 lambda: model.set_decoder_input_embeddings(torch.nn.Embedding(2, 32)),
                 lambda: model.resize_decoder_token_embeddings(60)):
        with pytest.raises(ValueError, match="share_encoder_decoder_embeddings"):
            call()


def build_model(backbone: str, processor, tiny_configs, encoder_type: str, fields: dict):
    """A tiny model of either backbone (seed 0)."""
    torch.manual_seed(0)
    if backbone == "marian":
        config = tiny_configs[0](processor, encoder_type, dropout=0.0, attention_dropout=0.0, init_std=0.5, **fields)
        return MgsaForConditionalGeneration(config)
    return MgsaT5ForConditionalGeneration(tiny_configs[1](processor, encoder_type, initializer_factor=4.0, **fields))


@pytest.fixture(scope="module")
def pair_batch(multi30k_processor, multi30k_val):
    """Three Multi30k val pairs through the processor (padded, syntax fields included)."""
    sources, targets = multi30k_val[0][:3], multi30k_val[1][:3]
    batch = dict(multi30k_processor(sources, text_target=targets, return_tensors="pt"))
    assert not bool(batch["attention_mask"].all())
    return batch


# the Marian backbone's one-graph rows are traced in test_compile.py (`test_compiled_loss_and_gradients_equal_eager`)
@pytest.mark.parametrize("backbone, encoder_type, fields",
                         [("t5", *row) for row in [*ROWS.items(), RECURRENCE]] + [("marian", *RECURRENCE)],
                         ids=lambda value: str(value))
def test_can_compile_fullgraph_says_whether_the_model_is_one_graph(backbone, encoder_type, fields,
                                                                   multi30k_processor, tiny_config, tiny_t5_config,
                                                                   pair_batch):
    """A model's `_can_compile_fullgraph` is True exactly when `torch.compile(fullgraph=True)` runs its training
    forward (loss included), which raises at a graph break; the class's value, what tools read before building a
    model, is that of the default configuration."""
    import torch._dynamo

    model = build_model(backbone, multi30k_processor, (tiny_config, tiny_t5_config), encoder_type, fields).train()
    torch._dynamo.reset()
    try:
        torch.compile(model, backend="eager", fullgraph=True)(**pair_batch)
        one_graph = True
    except torch._dynamo.exc.Unsupported:
        one_graph = False
    finally:
        torch._dynamo.reset()
    assert model._can_compile_fullgraph == one_graph
    assert model._can_compile_fullgraph == ((encoder_type, fields) != RECURRENCE)
    assert type(model)._can_compile_fullgraph is True


@pytest.mark.parametrize("backbone", ["marian", "t5"])
@pytest.mark.parametrize("encoder_type", list(ROWS))
def test_static_cache_generation_compiles_fullgraph_and_matches_eager(backbone, encoder_type, multi30k_processor,
                                                                      tiny_config, tiny_t5_config, pair_batch):
    """`generate(cache_implementation="static")` through transformers' own compile path (`compile_config`, fullgraph:
    a graph break is an error) gives eager greedy decoding's tokens and logits. The backend is TorchDynamo's graph run
    as traced (no code generation, seconds on CPU); the graphs it receives show that the decoding steps were
    compiled."""
    model = build_model(backbone, multi30k_processor, (tiny_config, tiny_t5_config), encoder_type,
                        ROWS[encoder_type]).eval()
    assert model._can_compile_fullgraph
    inputs = {key: value for key, value in pair_batch.items() if key != "labels"}
    settings = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, num_beams=1, output_logits=True,
                    return_dict_in_generate=True)
    eager = model.generate(**inputs, **settings)

    graphs = []

    def record_graph(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compile_config = CompileConfig(fullgraph=True, backend=record_graph, mode=None)
    compile_config._compile_all_devices = True  # transformers compiles on accelerators only unless told so
    torch._dynamo.reset()
    compiled = model.generate(**inputs, **settings, cache_implementation="static", compile_config=compile_config)
    torch._dynamo.reset()
    assert graphs, "generate did not compile the decoding steps"
    assert torch.equal(compiled.sequences, eager.sequences)
    # float noise only: a static cache attends over all its slots, the unfilled ones masked
    torch.testing.assert_close(torch.stack(compiled.logits), torch.stack(eager.logits), atol=1e-3, rtol=1e-4)


FORWARDS = [MgsaEncoder, MgsaDecoder, MgsaModel, MgsaForConditionalGeneration,
            MgsaT5Encoder, MgsaT5Decoder, MgsaT5Model, MgsaT5ForConditionalGeneration]


@pytest.mark.parametrize("model_class", FORWARDS, ids=lambda model_class: model_class.__name__)
def test_forward_kwargs_are_transformers_kwargs(model_class):
    """Each forward's `**kwargs` is `Unpack[TransformersKwargs]` (for the decoders, a TypedDict that extends it with
    PR's source phrases), read as transformers' docstring tooling reads it: the `**` parameter of the signature, the
    TypedDict inside `Unpack`, its annotations."""
    parameters = inspect.signature(model_class.forward).parameters.values()
    (kwargs,) = [parameter for parameter in parameters if parameter.kind is inspect.Parameter.VAR_KEYWORD]
    assert typing.get_origin(kwargs.annotation) is not None, f"{model_class.__name__}'s **kwargs are untyped"
    (kwargs_type,) = typing.get_args(kwargs.annotation)
    assert "output_attentions" in kwargs_type.__annotations__
    assert TransformersKwargs.__annotations__.items() <= kwargs_type.__annotations__.items()
    if model_class in (MgsaDecoder, MgsaT5Decoder):
        assert {"encoder_phrase_states", "encoder_phrase_mask"} <= kwargs_type.__optional_keys__
    else:
        assert kwargs_type is TransformersKwargs
