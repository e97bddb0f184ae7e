"""`gradient_checkpointing_enable()` trains every encoder type with the same loss and gradients as without it (MG-SA's
tag loss included), on a real processor batch."""

import pytest
import torch

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration


pytestmark = pytest.mark.usefixtures("one_thread")

ROWS = {
    "transformer": {},
    "phrase_memory": {"phrase_partition": "syntactic", "phrase_tag_supervision": True,
                      "phrase_interaction": "on_lstm"},
    "phrase_representation": {},
    "hybrid": {},
    "rhe": {},
}


@pytest.fixture(scope="module")
def batch(multi30k_processor, multi30k_val):
    sources, targets = (sentences[:4] for sentences in multi30k_val)
    return dict(multi30k_processor(sources, text_target=targets, return_tensors="pt"))


def loss_and_gradients(config: MgsaConfig, batch: dict, checkpointing: bool):
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(config).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        assert model.is_gradient_checkpointing
    output = model(**batch)
    output.loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return output, gradients


@pytest.mark.parametrize("encoder_type", list(ROWS))
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(encoder_type, multi30k_processor, batch,
                                                                   tiny_config):
    config = tiny_config(multi30k_processor, encoder_type, decoder_layers=2, dropout=0.0, attention_dropout=0.0,
                         **ROWS[encoder_type])
    plain, plain_gradients = loss_and_gradients(config, batch, checkpointing=False)
    checkpointed, checkpointed_gradients = loss_and_gradients(config, batch, checkpointing=True)
    torch.testing.assert_close(checkpointed.loss, plain.loss)
    if config.phrase_tag_supervision:
        assert plain.tag_loss is not None and plain.tag_loss > 0
        torch.testing.assert_close(checkpointed.tag_loss, plain.tag_loss)
    assert checkpointed_gradients.keys() == plain_gradients.keys()
    for name, gradient in plain_gradients.items():
        torch.testing.assert_close(checkpointed_gradients[name], gradient, atol=1e-6, rtol=1e-4, msg=name)
