"""`gradient_checkpointing_enable()`, reentrant or not, trains every encoder type on both backbones with the same loss
and gradients as without it (MG-SA's tag loss, PR's source phrases and T5's shared position bias included), on a real
processor batch."""

import pytest
import torch

from mgsa_hf import MgsaForConditionalGeneration, MgsaT5ForConditionalGeneration


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


def loss_and_gradients(model_class, config, batch: dict, use_reentrant: bool | None):
    """Loss output and gradients of a fresh model (seed 0) trained one step, checkpointed unless `use_reentrant` is
    None."""
    torch.manual_seed(0)
    model = model_class(config).train()
    if use_reentrant is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
        assert model.is_gradient_checkpointing
    output = model(**batch)
    output.loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return output, gradients


@pytest.mark.parametrize("backbone", ["marian", "t5"])
@pytest.mark.parametrize("encoder_type", list(ROWS))
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(backbone, encoder_type, multi30k_processor, batch,
                                                                   tiny_config, tiny_t5_config):
    if backbone == "marian":
        model_class = MgsaForConditionalGeneration
        config = tiny_config(multi30k_processor, encoder_type, decoder_layers=2, dropout=0.0, attention_dropout=0.0,
                             **ROWS[encoder_type])
    else:
        model_class = MgsaT5ForConditionalGeneration
        config = tiny_t5_config(multi30k_processor, encoder_type, **ROWS[encoder_type])
    plain, plain_gradients = loss_and_gradients(model_class, config, batch, use_reentrant=None)
    if config.encoder_type == "phrase_memory" and config.phrase_tag_supervision:
        assert plain.tag_loss is not None and plain.tag_loss > 0
    for use_reentrant in (False, True):
        checkpointed, checkpointed_gradients = loss_and_gradients(model_class, config, batch, use_reentrant)
        torch.testing.assert_close(checkpointed.loss, plain.loss)
        if config.encoder_type == "phrase_memory" and config.phrase_tag_supervision:
            torch.testing.assert_close(checkpointed.tag_loss, plain.tag_loss)
        assert checkpointed_gradients.keys() == plain_gradients.keys(), use_reentrant
        for name, gradient in plain_gradients.items():
            torch.testing.assert_close(checkpointed_gradients[name], gradient, atol=1e-6, rtol=1e-4,
                                       msg=f"{name}, use_reentrant={use_reentrant}")
