"""`output_attentions` as the reference classes give it (issue #45): for every encoder type, backbone and attention
backend, the encoder, decoder and cross attentions have the length and shapes of `MarianMTModel`'s (Marian backbone)
or `T5ForConditionalGeneration`'s (T5 backbone): one (B, H, T, S) entry per layer under eager, none under the fused
kernels, never a partial tuple where `[-1]` would silently be another layer."""

import pytest
import torch
from conftest import TINY_SIZES
from transformers import MarianConfig, MarianMTModel, T5Config, T5ForConditionalGeneration

from mgsa_hf import MgsaForConditionalGeneration, MgsaT5ForConditionalGeneration
from mgsa_hf.variants import VARIANTS


pytestmark = pytest.mark.usefixtures("one_thread")

SOURCES = ["A man rides a bike down the street.", "Two dogs play."]
TARGETS = ["Ein Mann fährt mit dem Fahrrad.", "Zwei Hunde spielen."]
T5_SIZES = dict(d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0)
# the backends that run on CPU (flex attention compiles a kernel per shape, minutes on CPU: it follows sdpa's path,
# the weights of the fused kernels being None alike)
CASES = [(backend, backbone) for backend in ("eager", "sdpa") for backbone in ("marian", "t5")]
FIELDS = ("encoder_attentions", "decoder_attentions", "cross_attentions")


@pytest.fixture(scope="module")
def batch(multi30k_processor):
    return dict(multi30k_processor(SOURCES, text_target=TARGETS, return_tensors="pt"))


def special_tokens(processor) -> dict:
    tokenizer = processor.tokenizer
    return dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                decoder_start_token_id=tokenizer.pad_token_id)


def attention_shapes(outputs) -> dict:
    """Each attention field as None or the list of its entries' shapes."""
    fields = {field: getattr(outputs, field) for field in FIELDS}
    return {field: value if value is None else [tuple(entry.shape) for entry in value]
            for field, value in fields.items()}


@pytest.fixture(scope="module")
def reference_shapes(multi30k_processor, batch):
    """The shapes of the reference class's attentions on the plain inputs of `batch`, per (backend, backbone)."""
    plain = {name: batch[name] for name in ("input_ids", "attention_mask", "labels")}
    shapes = {}
    for backend, backbone in CASES:
        torch.manual_seed(0)
        if backbone == "marian":
            sizes = {key: value for key, value in TINY_SIZES.items() if key != "init_std"}
            config = MarianConfig(**special_tokens(multi30k_processor), **sizes, attn_implementation=backend)
            reference = MarianMTModel(config).eval()
        else:
            config = T5Config(**special_tokens(multi30k_processor), **T5_SIZES, attn_implementation=backend)
            reference = T5ForConditionalGeneration(config).eval()
        with torch.no_grad():
            shapes[backend, backbone] = attention_shapes(reference(**plain, output_attentions=True))
    return shapes


def build(processor, encoder_type: str, backbone: str, backend: str):
    torch.manual_seed(0)
    common = dict(**special_tokens(processor), encoder_type=encoder_type, num_phrase_tags=len(processor.phrase_tags),
                  attn_implementation=backend)
    if backbone == "marian":
        return MgsaForConditionalGeneration.config_class(**TINY_SIZES, **common)
    return MgsaT5ForConditionalGeneration.config_class(**T5_SIZES, **common)


@pytest.mark.parametrize("encoder_type", list(VARIANTS))
@pytest.mark.parametrize(("backend", "backbone"), CASES, ids=[f"{backend}-{backbone}" for backend, backbone in CASES])
def test_output_attentions_as_the_reference_class(multi30k_processor, batch, reference_shapes, encoder_type, backend,
                                                  backbone):
    config = build(multi30k_processor, encoder_type, backbone, backend)
    model_class = MgsaForConditionalGeneration if backbone == "marian" else MgsaT5ForConditionalGeneration
    model = model_class(config).eval()
    with torch.no_grad():
        outputs = model(**batch, output_attentions=True)
    expected = reference_shapes[backend, backbone]
    assert attention_shapes(outputs) == expected
    if backend == "eager":
        # a variant's layer gives its own weights in its own place: distributions over the real source tokens
        assert len(expected["encoder_attentions"]) == len(model.get_encoder().block if backbone == "t5" else
                                                          model.get_encoder().layers)
        real = batch["attention_mask"].bool()
        for weights in outputs.encoder_attentions:
            rows = weights.transpose(1, 2)[real]  # (real queries, H, L)
            torch.testing.assert_close(rows.sum(-1), torch.ones(rows.shape[:2]))
            keys = real[:, None, :].expand(-1, weights.shape[1], -1).unsqueeze(2).expand_as(weights).transpose(1, 2)
            assert (rows.masked_select(~keys[real]) < 1e-6).all()  # padding keys get nothing
