"""The checks every registered variant passes on both backbones (`variants.VARIANTS` × Marian, T5): forward and loss,
padding invariance, generation, save and load and gradient checkpointing; and what the registry promises (every
field documented and prefixed, output fields that the outputs carry, syntax fields named in every forward). TorchDynamo
and `torch.compile` per variant: test_compile.py (Marian's training forward, loss and gradients) and test_model_api.py
(`_can_compile_fullgraph` on T5 and for MG-SA's recurrences, static-cache generation on both backbones)."""

import dataclasses
import inspect

import pytest
import torch

from mgsa_hf import (
    MgsaForConditionalGeneration,
    MgsaModel,
    MgsaT5ForConditionalGeneration,
    MgsaT5Model,
)
from mgsa_hf.configuration_mgsa import MgsaConfig, MgsaT5Config, MgsaVariantConfig
from mgsa_hf.modeling_loss import translation_loss, with_tag_loss
from mgsa_hf.modeling_mgsa import MgsaEncoder
from mgsa_hf.modeling_mgsa_t5 import MgsaT5Encoder
from mgsa_hf.modeling_outputs_mgsa import MgsaEncoderOutput, MgsaLayerOutput
from mgsa_hf.modeling_syntax_inputs import SYNTAX_INPUT_NAMES
from mgsa_hf.variants import VARIANTS


CASES = [(name, backbone) for name in VARIANTS for backbone in ("marian", "t5")]
SOURCES = ["A man rides a bike down the street.", "Two dogs play."]
TARGETS = ["Ein Mann fährt mit dem Fahrrad die Straße hinunter.", "Zwei Hunde spielen."]


@pytest.fixture(scope="module")
def batch(multi30k_processor):
    return dict(multi30k_processor(SOURCES, text_target=TARGETS, return_tensors="pt"))


def build(name, backbone, processor, tiny_config, tiny_t5_config, **fields):
    torch.manual_seed(0)
    if backbone == "marian":
        return MgsaForConditionalGeneration(tiny_config(processor, name, dropout=0.0, **fields)).eval()
    return MgsaT5ForConditionalGeneration(tiny_t5_config(processor, name, **fields)).eval()


@pytest.fixture
def model(request, multi30k_processor, tiny_config, tiny_t5_config):
    name, backbone = request.param
    return build(name, backbone, multi30k_processor, tiny_config, tiny_t5_config)


@pytest.mark.parametrize("model", CASES, indirect=True, ids=[f"{name}-{backbone}" for name, backbone in CASES])
def test_forward_loss_and_outputs(model, batch):
    """The loss is the label-smoothed translation loss plus λ times the tag loss on its scale, and the encoder returns
    what its variant's layers contribute."""
    model.config.label_smoothing = 0.1
    model.train()
    outputs = model(**batch)
    expected = with_tag_loss(translation_loss(outputs.logits, batch["labels"], 0.1), outputs.tag_loss,
                             model.config.phrase_tag_loss_weight, batch["labels"])
    torch.testing.assert_close(outputs.loss, expected)
    assert outputs.logits.shape[:2] == batch["labels"].shape and torch.isfinite(outputs.loss)
    encoded = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                  **{name: batch[name] for name in SYNTAX_INPUT_NAMES if name in batch})
    for field in model.config.variant.output_fields:
        assert getattr(encoded, field) is not None, field
    outputs.loss.backward()


@pytest.mark.parametrize("model", CASES, indirect=True, ids=[f"{name}-{backbone}" for name, backbone in CASES])
def test_padding_invariance(model, multi30k_processor):
    """A sentence's logits do not depend on the padding a longer sentence of its batch gives it."""
    together = dict(multi30k_processor(SOURCES, text_target=TARGETS, return_tensors="pt"))
    alone = dict(multi30k_processor(SOURCES[1:], text_target=TARGETS[1:], return_tensors="pt"))
    with torch.no_grad():
        padded = model(**together).logits[1]
        single = model(**alone).logits[0]
    length = alone["labels"].shape[1]
    torch.testing.assert_close(padded[:length], single, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("model", CASES, indirect=True, ids=[f"{name}-{backbone}" for name, backbone in CASES])
def test_generate_save_and_load(model, batch, tmp_path):
    """Beam search runs from the processor's inputs; a saved model loads with the same logits and translations."""
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    generated = model.generate(**inputs, num_beams=2, max_new_tokens=5)
    assert generated.shape[0] == 2
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    assert loaded.config.encoder_type == model.config.encoder_type
    with torch.no_grad():
        # within transformers' own save-and-load tolerance (1e-5): RHE on T5 differs by about 1e-6 after a reload
        # with equal weights (the same before the variants were plug-ins); every other case is bit-equal
        torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits, atol=1e-5, rtol=0)
    assert torch.equal(loaded.generate(**inputs, num_beams=2, max_new_tokens=5), generated)


@pytest.mark.parametrize("model", CASES, indirect=True, ids=[f"{name}-{backbone}" for name, backbone in CASES])
def test_gradient_checkpointing(model, batch):
    """Checkpointed layers give the loss and gradients of plain ones."""
    model.train()
    model.config.dropout = model.config.attention_dropout = 0.0

    def loss_and_grads():
        model.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    reference, reference_grads = loss_and_grads()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loss, grads = loss_and_grads()
    torch.testing.assert_close(loss, reference)
    assert grads.keys() == reference_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], reference_grads[name], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("forward", [MgsaModel.forward, MgsaForConditionalGeneration.forward, MgsaEncoder.forward,
                                     MgsaT5Model.forward, MgsaT5ForConditionalGeneration.forward,
                                     MgsaT5Encoder.forward])
def test_every_public_forward_names_every_syntax_field(forward):
    """`Trainer` and `generate` pass inputs by the names of a forward's signature: each takes every syntax field."""
    assert set(SYNTAX_INPUT_NAMES) <= set(inspect.signature(forward).parameters)


@pytest.mark.parametrize("name", [name for name, variant in VARIANTS.items() if variant.config_fields])
def test_a_variant_declares_its_fields_once(name):
    """Every field of a variant carries one of its prefixes and is documented in the configs' docstring, and its
    output fields are fields of the layer and encoder outputs."""
    variant = VARIANTS[name]
    for field in dataclasses.fields(variant.config_fields):
        assert field.name.startswith(variant.field_prefixes), field.name
        assert field.name in MgsaVariantConfig.__doc__, field.name
        assert field.name in MgsaConfig.field_names() and field.name in MgsaT5Config.field_names()
    layer_fields = {field.name for field in dataclasses.fields(MgsaLayerOutput)}
    assert set(variant.output_fields) <= layer_fields <= set(MgsaEncoderOutput.__dataclass_fields__)
    if variant.layers_field:
        assert getattr(MgsaConfig(encoder_type=name), variant.layers_field) == list(variant.default_layers)
