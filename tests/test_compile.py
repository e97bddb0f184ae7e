"""`torch.compile` on real Multi30k batches (processor output, padding included): the variants whose shapes do not
depend on the data trace a training forward as one graph, and every variant, graph breaks included, computes under
TorchDynamo the loss and gradients it computes eagerly (and under the default Inductor backend for one row)."""

import shutil

import pytest
import torch

from mgsa_hf import MgsaForConditionalGeneration


# (encoder_type, variant fields) of the rows that trace as one graph: their tensors' shapes follow from the batch's
# shape alone (PR's phrase count and MG-SA's syntactic one are bounds from the shape under compile, RHE-prune computes
# every head's context there)
ONE_GRAPH = [
    ("transformer", {}),
    ("phrase_memory", {"phrase_partition": "ngram", "phrase_tag_supervision": False, "phrase_interaction": "none"}),
    ("hybrid", {}),
    ("rhe", {}),
    ("rhe", {"rhe_attention": "dea"}),
    ("rhe", {"rhe_mode": "rhe_prune"}),
    ("phrase_representation", {}),
    ("phrase_representation", {"pr_segmentation": "parse"}),
]
# and MG-SA's recurrences, which run eagerly (their number of steps depends on the data): the default's (the paper's
# final system) ON-LSTM over the phrases and the LSTM composition over each phrase's words (torch's `nn.LSTM`, which
# the LSTM interaction runs on the same path as the ON-LSTM)
EAGER_RECURRENCE = [
    ("phrase_memory", {}),
    ("phrase_memory", {"phrase_composition": "lstm", "phrase_interaction": "none"}),
]


def model_and_batch(processor, sentence_pairs, tiny_config, encoder_type, fields):
    torch.manual_seed(0)
    config = tiny_config(processor, encoder_type, dropout=0.0, attention_dropout=0.0, **fields)
    model = MgsaForConditionalGeneration(config).train()  # the training path, without dropout's randomness
    sources, targets = sentence_pairs[0][:4], sentence_pairs[1][:4]
    batch = processor(sources, text_target=targets, padding=True, return_tensors="pt")
    assert not bool(batch["attention_mask"].all())  # padding is part of what is traced
    return model, dict(batch)


@pytest.mark.parametrize("encoder_type, fields", ONE_GRAPH + EAGER_RECURRENCE, ids=lambda value: str(value))
def test_compiled_loss_and_gradients_equal_eager(multi30k_processor, multi30k_val, tiny_config, encoder_type, fields):
    """The loss and gradients under TorchDynamo and AOTAutograd equal the eager ones; the one-graph rows compile with
    `fullgraph=True` (a graph break stops the trace, naming its reason) and say so to transformers' tooling."""
    import torch._dynamo

    one_graph = (encoder_type, fields) in ONE_GRAPH
    model, batch = model_and_batch(multi30k_processor, multi30k_val, tiny_config, encoder_type, fields)
    eager_loss = model(**batch).loss
    eager_loss.backward()
    eager_grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    # TorchDynamo + AOTAutograd, no code generation
    compiled_loss = torch.compile(model, backend="aot_eager", fullgraph=one_graph)(**batch).loss
    assert model._can_compile_fullgraph == one_graph  # what transformers' tooling reads (T5: test_model_api.py)
    compiled_loss.backward()
    torch._dynamo.reset()
    torch.testing.assert_close(compiled_loss, eager_loss)
    grads = {name: param.grad for name, param in model.named_parameters() if param.grad is not None}
    assert grads.keys() == eager_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], msg=name)


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="Inductor needs a C++ compiler")
def test_default_backend_compiles_and_matches_eager(multi30k_processor, multi30k_val, tiny_config):
    """The default backend (Inductor, generated C++ on CPU) on a one-graph row with phrase pooling and attention (PR),
    one layer each side; the rows above check what TorchDynamo and AOTAutograd compute, whatever the backend. Every
    row under Inductor, timed against eager: `scripts/bench_speed.py --compile-check --compile-steps N`."""
    import torch._dynamo

    encoder_type, fields = ONE_GRAPH[6]
    fields = {**fields, "encoder_layers": 1, "decoder_layers": 1}
    model, batch = model_and_batch(multi30k_processor, multi30k_val, tiny_config, encoder_type, fields)
    eager_loss = model(**batch).loss
    torch._dynamo.reset()
    compiled_loss = torch.compile(model)(**batch).loss
    compiled_loss.backward()
    torch._dynamo.reset()
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-4, atol=1e-5)
    assert all(torch.isfinite(param.grad).all() for param in model.parameters() if param.grad is not None)


@pytest.mark.parametrize("encoder_type, fields, name, eager_match, compiled_match", [
    (*EAGER_RECURRENCE[0], "phrase_tags", "num_phrase_tags", "num_phrase_tags"),
    (*EAGER_RECURRENCE[0], "phrase_ids", "numbers", "0, 1"),
    ("phrase_representation", {"pr_segmentation": "parse"}, "pr_phrase_ids", "number", "0, 1"),
], ids=["phrase_tags", "phrase_ids", "pr_phrase_ids"])
def test_bad_syntax_ids_are_refused_compiled_too(multi30k_processor, multi30k_val, tiny_config, encoder_type, fields,
                                                 name, eager_match, compiled_match):
    """Tag ids past `num_phrase_tags` and phrase ids past the sentence length raise eagerly (ValueError) and in a
    compiled graph, where they are checked on the device (the phrase count there being a bound from the shape)."""
    import torch._dynamo

    model, batch = model_and_batch(multi30k_processor, multi30k_val, tiny_config, encoder_type, fields)
    bad_id = model.config.num_phrase_tags if name == "phrase_tags" else batch["input_ids"].shape[1]
    batch[name] = batch[name].masked_fill(batch[name] >= 0, bad_id)
    with pytest.raises(ValueError, match=eager_match):
        model(**batch)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=compiled_match):
        torch.compile(model, backend="aot_eager")(**batch)
    torch._dynamo.reset()
