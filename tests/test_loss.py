"""The model's own loss: label smoothing inside the model (both backbones) equals the Trainer's `LabelSmoother`, so a
plain `Seq2SeqTrainer` trains MG-SA's tag loss (Eq. 10); a training batch without `phrase_tags` is refused, and a
Trainer that drops the tag loss is named once."""

import logging

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.trainer_pt_utils import LabelSmoother
from transformers.utils import logging as transformers_logging

from mgsa_hf import MgsaDataCollator, MgsaForConditionalGeneration, MgsaSeq2SeqTrainer, MgsaT5ForConditionalGeneration


pytestmark = pytest.mark.usefixtures("one_thread")

TAG_SUPERVISION = dict(phrase_partition="syntactic", phrase_tag_supervision=True)


@pytest.fixture(scope="module")
def batch(multi30k_processor, multi30k_val):
    """4 Multi30k val pairs with every syntax field; padded label positions are -100."""
    sources, targets = (sentences[:4] for sentences in multi30k_val)
    encoding = multi30k_processor(sources, text_target=targets, return_tensors="pt")
    pad = multi30k_processor.tokenizer.pad_token_id
    encoding["labels"] = encoding["labels"].masked_fill(encoding["labels"].eq(pad), -100)
    assert encoding["labels"].eq(-100).any()  # not vacuous: some positions are ignored
    return dict(encoding)


def tag_supervised_model(backbone, processor, tiny_config, tiny_t5_config, **fields):
    torch.manual_seed(0)
    if backbone == "t5":
        return MgsaT5ForConditionalGeneration(tiny_t5_config(processor, "phrase_memory", **TAG_SUPERVISION, **fields))
    config = tiny_config(processor, "phrase_memory", dropout=0.0, attention_dropout=0.0, **TAG_SUPERVISION, **fields)
    return MgsaForConditionalGeneration(config)


@pytest.mark.parametrize("backbone", ["marian", "t5"])
def test_label_smoothed_loss_equals_the_label_smoother(backbone, multi30k_processor, tiny_config, tiny_t5_config,
                                                       batch):
    """`loss` = LabelSmoother(ε) + λ · tag_loss per target token (the batch's sum of sentence tag losses over its
    non-ignored labels); with the Trainer's `num_items_in_batch` both terms are this batch's sums over that count."""
    model = tag_supervised_model(backbone, multi30k_processor, tiny_config, tiny_t5_config, label_smoothing=0.1,
                                 phrase_tag_loss_weight=2.0).train()
    outputs = model(**batch)
    labels = batch["labels"]
    smoothed = LabelSmoother(epsilon=0.1)(outputs, labels)
    torch.testing.assert_close(outputs.translation_loss, smoothed)
    torch.testing.assert_close(outputs.translation_loss, torch.nn.functional.cross_entropy(
        outputs.logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=0.1))
    assert outputs.tag_loss > 0
    sentences, tokens = len(labels), labels.ne(-100).sum()
    torch.testing.assert_close(outputs.loss, smoothed + 2.0 * outputs.tag_loss * sentences / tokens)
    # unsmoothed, it is not the same loss
    assert (smoothed - LabelSmoother(epsilon=0.0)(outputs, labels)).abs() > 1e-5

    items = torch.tensor(3 * int(labels.ne(-100).sum()))  # as if this were one of three accumulated batches
    outputs = model(**batch, num_items_in_batch=items)
    expected = (LabelSmoother(epsilon=0.1)(outputs, labels, num_items_in_batch=items)
                + 2.0 * outputs.tag_loss * sentences / items)
    torch.testing.assert_close(outputs.loss, expected)


def make_trainer(trainer_class, model, processor, tmp_path, features, **arguments):
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2,
                                    logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
                                    learning_rate=1e-3, **arguments)
    collator = MgsaDataCollator(tokenizer=processor.tokenizer, model=model)
    return trainer_class(model=model, args=args, train_dataset=features, data_collator=collator)


@pytest.fixture(scope="module")
def features(multi30k_processor, multi30k_val):
    sources, targets = (sentences[:8] for sentences in multi30k_val)
    encoding = multi30k_processor(sources, text_target=targets)
    return [{key: encoding[key][i] for key in encoding} for i in range(len(sources))]


def test_plain_trainer_trains_the_label_smoothed_loss_with_the_tag_loss(multi30k_processor, tiny_config,
                                                                        tiny_t5_config, features, tmp_path):
    """With the model's `label_smoothing` (and no `label_smoothing_factor`) the plain Trainer's loss is the
    label-smoothed translation loss plus λ · tag loss per target token, and the tag classifier trains."""
    model = tag_supervised_model("marian", multi30k_processor, tiny_config, tiny_t5_config, label_smoothing=0.1,
                                 phrase_tag_loss_weight=2.0)
    trainer = make_trainer(Seq2SeqTrainer, model, multi30k_processor, tmp_path, features)
    trainer.model.train()
    inputs = trainer._prepare_inputs(trainer.data_collator(features[:4]))
    loss, outputs = trainer.compute_loss(trainer.model, dict(inputs), return_outputs=True)
    assert outputs.tag_loss > 0
    smoothed = LabelSmoother(epsilon=0.1)(outputs, inputs["labels"])
    labels = inputs["labels"]
    torch.testing.assert_close(loss, smoothed + 2.0 * outputs.tag_loss * len(labels) / labels.ne(-100).sum())
    assert (smoothed - LabelSmoother(epsilon=0.0)(outputs, inputs["labels"])).abs() > 1e-5

    classifier = trainer.model.get_encoder().layers[0].self_attn.tag_classifier
    before = classifier.weight.detach().clone()
    trainer.train()
    assert not torch.equal(before, classifier.weight)


def drop_warning_records(caplog):
    return [record for record in caplog.records if "MgsaSeq2SeqTrainer" in record.getMessage()]


def test_a_trainer_that_drops_the_tag_loss_is_named_once(multi30k_processor, tiny_config, tiny_t5_config, features,
                                                        tmp_path, caplog):
    """A plain Trainer with `label_smoothing_factor` calls the model without labels and leaves out the tag loss: one
    warning names the two ways that keep it. `MgsaSeq2SeqTrainer`, evaluation and `generate` give none."""
    transformers_logging.warning_once.cache_clear()
    model = tag_supervised_model("marian", multi30k_processor, tiny_config, tiny_t5_config)
    inputs = MgsaDataCollator(tokenizer=multi30k_processor.tokenizer, model=model)(features[:4])
    with caplog.at_level(logging.WARNING):
        trainer = make_trainer(MgsaSeq2SeqTrainer, model, multi30k_processor, tmp_path, features,
                               label_smoothing_factor=0.1)
        trainer.model.train()
        trainer.compute_loss(trainer.model, dict(inputs))
        sources = {name: value for name, value in inputs.items() if name not in ("labels", "decoder_input_ids")}
        model.generate(**sources, num_beams=2, max_new_tokens=3)  # in training mode: the encoder runs on its own
        model.eval()(**sources, decoder_input_ids=inputs["decoder_input_ids"])
        assert not drop_warning_records(caplog)

        trainer = make_trainer(Seq2SeqTrainer, model, multi30k_processor, tmp_path, features,
                               label_smoothing_factor=0.1)
        trainer.model.train()
        for _ in range(2):
            trainer.compute_loss(trainer.model, dict(inputs))
    records = drop_warning_records(caplog)
    assert len(records) == 1
    assert "label_smoothing" in records[0].getMessage() and "label_smoothing_factor" in records[0].getMessage()


def test_the_benchmark_loop_trains_the_tag_loss_without_the_drop_warning(multi30k_processor, tiny_config,
                                                                         tiny_t5_config, features, caplog):
    """`prepared_training.training_step` calls the model without labels and adds the tag loss itself (Eq. 12): its
    loss is the label-smoothed translation loss plus λ · tag loss per target token, and the model does not warn that
    the tag loss is left out."""
    from mgsa_hf.modeling_loss import translation_loss
    from mgsa_hf.training.prepared import Recipe, make_optimizer, training_step

    transformers_logging.warning_once.cache_clear()
    model = tag_supervised_model("marian", multi30k_processor, tiny_config, tiny_t5_config, phrase_tag_loss_weight=2.0)
    inputs = MgsaDataCollator(tokenizer=multi30k_processor.tokenizer, model=model)(features[:4])
    inputs.pop("decoder_input_ids", None)
    recipe = Recipe(learning_rate=0.0, warmup_steps=1, label_smoothing=0.1, max_grad_norm=0.0)
    optimizer, scheduler = make_optimizer(model, recipe)
    model.train()
    with caplog.at_level(logging.WARNING):
        loss = training_step(model, dict(inputs), recipe, optimizer, scheduler)
    assert not drop_warning_records(caplog)
    assert not model.tag_loss_added_by_caller  # set for the step only

    labels = inputs["labels"]
    # the same loss again: the model has no dropout, and learning rate 0 left its weights as they were
    with torch.no_grad():
        outputs = model(**{name: value for name, value in inputs.items() if name != "labels"},
                        decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels=labels))
    assert outputs.tag_loss > 0
    tag_term = 2.0 * outputs.tag_loss * len(labels) / labels.ne(-100).sum()
    expected = translation_loss(outputs.logits, labels, 0.1) + tag_term
    assert loss == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("backbone", ["marian", "t5"])
def test_training_batch_without_phrase_tags_is_refused(backbone, multi30k_processor, tiny_config, tiny_t5_config,
                                                       batch):
    model = tag_supervised_model(backbone, multi30k_processor, tiny_config, tiny_t5_config).train()
    untagged = {name: value for name, value in batch.items() if name != "phrase_tags"}
    with pytest.raises(ValueError, match=r"`phrase_tags`.*phrase_levels.*MgsaDataCollator"):
        model(**untagged)
    # without labels (translation) or in evaluation, no tags are needed
    sources = {name: value for name, value in untagged.items() if name != "labels"}
    assert model.generate(**sources, max_new_tokens=3).shape[0] == 4
    assert torch.isfinite(model.eval()(**untagged).loss)


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_label_smoothing_out_of_range_is_refused(value):
    from mgsa_hf import MgsaConfig, MgsaT5Config

    for config_class in (MgsaConfig, MgsaT5Config):
        with pytest.raises(StrictDataclassError, match=r"(?s)label_smoothing.*must be in \[0, 1\)"):
            config_class(label_smoothing=value)
