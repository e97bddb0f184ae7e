"""`MgsaSeq2SeqTrainer`: MG-SA's tag loss (Eq. 10) trains under the Trainer's label smoothing, and is logged;
token-count batches."""

import numpy as np
import pytest
import torch
from transformers import DataCollatorForSeq2Seq, DataCollatorWithPadding, Seq2SeqTrainer, Seq2SeqTrainingArguments

from mgsa_hf import MgsaDataCollator, MgsaForConditionalGeneration, MgsaSeq2SeqTrainer
from mgsa_hf.training.trainer import TokenBatchSampler


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def features(multi30k_processor, multi30k_val):
    """The first 8 Multi30k val pairs as per-sentence features (every syntax field), as a dataset holds them."""
    sources, targets = (sentences[:8] for sentences in multi30k_val)
    encoding = multi30k_processor(sources, text_target=targets)
    return [{key: encoding[key][i] for key in encoding} for i in range(len(sources))]


def make_trainer(trainer_class, tiny_config, processor, features, tmp_path, weight: float, smoothing: float = 0.1,
                 **arguments):
    torch.manual_seed(0)
    # MG-SA Table 3 row 4: syntactic phrases + tag supervision, tiny
    config = tiny_config(processor, "phrase_memory", dropout=0.0, attention_dropout=0.0, phrase_partition="syntactic",
                         phrase_tag_supervision=True, phrase_tag_loss_weight=weight)
    model = MgsaForConditionalGeneration(config)
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), label_smoothing_factor=smoothing, per_device_train_batch_size=4, max_steps=2,
        logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", learning_rate=1e-3, **arguments,
    )
    collator = MgsaDataCollator(tokenizer=processor.tokenizer, model=model)
    return trainer_class(model=model, args=args, train_dataset=features, data_collator=collator)


def batch_of(trainer, features):
    return trainer._prepare_inputs(trainer.data_collator(features[:4]))


def test_label_smoothed_loss_includes_tag_loss(multi30k_processor, tiny_config, features, tmp_path):
    """Under label smoothing 0.1 the Trainer's loss moves with λ by exactly λ × the model's tag loss per target token
    (the batch's sum of sentence tag losses over its target tokens, Eq. 12's balance); plain `Seq2SeqTrainer` drops
    the term (the reason this class exists)."""
    losses, tag_losses = {}, {}
    for weight in (0.001, 1000.0):
        trainer = make_trainer(MgsaSeq2SeqTrainer, tiny_config, multi30k_processor, features, tmp_path, weight)
        trainer.model.train()
        torch.manual_seed(1)
        inputs = batch_of(trainer, features)
        sentences, tokens = len(inputs["labels"]), int(inputs["labels"].ne(-100).sum())
        loss, outputs = trainer.compute_loss(trainer.model, inputs, return_outputs=True)
        losses[weight], tag_losses[weight] = loss.item(), outputs.tag_loss.item() * sentences / tokens
    assert tag_losses[0.001] > 0
    assert losses[1000.0] > losses[0.001] + 100 * tag_losses[0.001]
    torch.testing.assert_close(losses[1000.0] - losses[0.001], (1000.0 - 0.001) * tag_losses[0.001], rtol=1e-4,
                               atol=1e-3)

    plain = []
    for weight in (0.001, 1000.0):
        trainer = make_trainer(Seq2SeqTrainer, tiny_config, multi30k_processor, features, tmp_path, weight)
        torch.manual_seed(1)
        plain.append(trainer.compute_loss(trainer.model, batch_of(trainer, features)).item())
    assert plain[0] == pytest.approx(plain[1])


def test_tag_classifier_trains_and_tag_loss_is_logged(multi30k_processor, tiny_config, features, tmp_path):
    trainer = make_trainer(MgsaSeq2SeqTrainer, tiny_config, multi30k_processor, features, tmp_path, 1.0)
    classifiers = [layer.self_attn.tag_classifier for layer in trainer.model.get_encoder().layers
                   if getattr(layer.self_attn, "tag_classifier", None) is not None]
    assert classifiers
    before = [c.weight.detach().clone() for c in classifiers]
    trainer.train()
    assert all(not torch.equal(b, c.weight) for b, c in zip(before, classifiers, strict=True))
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2 and all(entry["tag_loss"] > 0 for entry in logged)


def test_gradient_accumulation_keeps_the_tag_share(multi30k_processor, tiny_config, features, tmp_path):
    """With 2 accumulation steps the tag term of each micro-batch is over the accumulated batch's target tokens when
    the Trainer normalises the translation loss over them, so that λ means the same with and without accumulation."""
    trainer = make_trainer(MgsaSeq2SeqTrainer, tiny_config, multi30k_processor, features, tmp_path, 1000.0,
                           gradient_accumulation_steps=2)
    trainer.model.train()
    scaled = trainer._translation_loss_scaled_for_accumulation(num_items_in_batch=torch.tensor(10))
    torch.manual_seed(1)
    inputs = batch_of(trainer, features)
    with_items, outputs = trainer.compute_loss(trainer.model, dict(inputs), return_outputs=True,
                                               num_items_in_batch=torch.tensor(10))
    torch.manual_seed(1)
    without_tag = trainer.label_smoother(outputs, inputs["labels"], num_items_in_batch=torch.tensor(10))
    tokens = torch.tensor(10) if scaled else inputs["labels"].ne(-100).sum()
    share = 1000.0 * outputs.tag_loss * len(inputs["labels"]) / tokens
    torch.testing.assert_close(with_items, without_tag + share, rtol=1e-4, atol=1e-3)


def test_token_batches_cover_the_data_once_within_the_limit():
    """Every epoch holds every example once, in batches of at most `max_tokens` padded tokens on either side (a
    sentence over the limit alone); the order changes with the epoch and the seed and repeats for equal ones."""
    rng = np.random.default_rng(0)
    sources, targets = rng.integers(2, 40, size=500), rng.integers(2, 40, size=500)
    sources[7] = 90  # longer than the limit: a batch of its own
    sampler = TokenBatchSampler(sources, targets, max_tokens=128, seed=3)
    epochs = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(index for batch in batches for index in batch) == list(range(500))
        for batch in batches:
            padded = max(max(sources[batch]), max(targets[batch])) * len(batch)
            assert padded <= 128 or batch == [7]
        epochs.append(batches)
    assert epochs[0] != epochs[1]
    again = TokenBatchSampler(sources, targets, max_tokens=128, seed=3)
    assert list(again) == epochs[0]
    assert list(TokenBatchSampler(sources, targets, max_tokens=128, seed=4)) != epochs[0]
    with pytest.raises(ValueError, match="positive"):
        TokenBatchSampler(sources, targets, max_tokens=0)
    # dealt to several processes: a multiple of their number of batches, each example at most once, the few left
    # over change with the epoch
    replicas = next(count for count in (3, 4, 5, 7) if len(sampler) % count)
    dealt = TokenBatchSampler(sources, targets, max_tokens=128, seed=3, num_replicas=replicas)
    assert len(dealt) % replicas == 0 and len(sampler) - replicas < len(dealt) < len(sampler)
    left_over = []
    for epoch in (0, 1):
        dealt.set_epoch(epoch)
        batches = list(dealt)
        indices = [index for batch in batches for index in batch]
        assert len(batches) == len(dealt) and len(indices) == len(set(indices))
        left_over.append(set(range(500)) - set(indices))
    assert left_over[0] != left_over[1]


@pytest.mark.parametrize(("high", "max_tokens"), [(60, 1), (60, 7), (60, 64), (60, 1000), (100_000, 150_000)])
def test_token_batches_are_the_greedy_cut_of_the_sorted_sentences(high, max_tokens):
    """The sampler's batches (cut per distinct length) are those of the greedy cut over the sentences sorted by length,
    one sentence at a time (`prepared.token_batches`): the same lengths in each batch, with empty sentences, sentences
    over the limit and lengths past 16 bits."""
    from mgsa_hf.training.prepared import token_batches

    rng = np.random.default_rng(max_tokens)
    sources, targets = rng.integers(0, high, size=700), rng.integers(0, high, size=700)
    longest = np.maximum(sources, targets)
    expected = sorted(tuple(longest[batch].tolist()) for batch in token_batches(sources, targets, max_tokens, None))
    batches = list(TokenBatchSampler(sources, targets, max_tokens, seed=5))
    assert sorted(tuple(sorted(longest[batch].tolist())) for batch in batches) == expected
    assert sorted(index for batch in batches for index in batch) == list(range(700))


def test_trainer_batches_by_token_count(multi30k_processor, tiny_config, multi30k_val, tmp_path):
    """With `max_tokens_per_batch` the Trainer's training batches are the sampler's: padded `input_ids` and `labels`
    within the limit, every sentence once per epoch, and training runs on them."""
    from datasets import Dataset

    sources, targets = multi30k_val
    encoding = multi30k_processor(sources, text_target=targets)
    dataset = Dataset.from_dict({key: encoding[key] for key in ("input_ids", "attention_mask", "labels")})
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer"))
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2,
                                    report_to="none", use_cpu=True, save_strategy="no")
    trainer = MgsaSeq2SeqTrainer(model=model, args=args, train_dataset=dataset, max_tokens_per_batch=160,
                                 data_collator=MgsaDataCollator(tokenizer=multi30k_processor.tokenizer, model=model))
    batches = list(trainer.get_train_dataloader())
    assert sum(len(batch["input_ids"]) for batch in batches) == len(sources)
    assert max(len(batch["input_ids"]) for batch in batches) > 4  # not per_device_train_batch_size
    for batch in batches:
        assert batch["input_ids"].numel() <= 160 and batch["labels"].numel() <= 160
    trainer.train()
    assert trainer.state.global_step == 2


def test_token_batch_run_reports_the_pairs_trained(multi30k_processor, tiny_config, multi30k_val, tmp_path):
    """With token batches `train_samples_per_second` is the sentence pairs trained over the runtime: one epoch of
    the 16 pairs here, in however many batches the sampler makes (the Trainer alone would count one pair per step,
    `per_device_train_batch_size`)."""
    from datasets import Dataset

    sources, targets = multi30k_val
    encoding = multi30k_processor(sources, text_target=targets)
    dataset = Dataset.from_dict({key: encoding[key] for key in ("input_ids", "attention_mask", "labels")})
    lengths = [[len(ids) for ids in encoding[key]] for key in ("input_ids", "labels")]
    steps_per_epoch = len(TokenBatchSampler(*lengths, max_tokens=160))
    assert 1 < steps_per_epoch < len(sources)
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer"))
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1,
                                    max_steps=steps_per_epoch, report_to="none", use_cpu=True, save_strategy="no")
    trainer = MgsaSeq2SeqTrainer(model=model, args=args, train_dataset=dataset, max_tokens_per_batch=160,
                                 data_collator=MgsaDataCollator(tokenizer=multi30k_processor.tokenizer, model=model))
    metrics = trainer.train().metrics
    assert trainer.state.epoch == 1.0
    assert metrics["train_samples_per_second"] == pytest.approx(len(sources) / metrics["train_runtime"], rel=2e-3)
    assert trainer.state.log_history[-1]["train_samples_per_second"] == metrics["train_samples_per_second"]


@pytest.mark.parametrize("collator", ["DataCollatorForSeq2Seq", "DataCollatorWithPadding", "the Trainer's default"])
def test_collator_that_cannot_pad_syntax_fields_is_refused(multi30k_processor, tiny_config, features, tmp_path,
                                                           collator):
    """transformers' collators pad only the tokenizer's fields: on rows with the processor's syntax fields batching
    fails with "Unable to create tensor ... `word_ids`", or with ragged lists; `MgsaSeq2SeqTrainer` refuses them
    when it is built, naming `MgsaDataCollator`. Rows without syntax fields keep any collator."""
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "rhe"))
    tokenizer = multi30k_processor.tokenizer
    data_collator = {"DataCollatorForSeq2Seq": DataCollatorForSeq2Seq(tokenizer, model=model),
                     "DataCollatorWithPadding": DataCollatorWithPadding(tokenizer),
                     "the Trainer's default": None}[collator]
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, save_strategy="no")
    plain = Seq2SeqTrainer(model=model, args=args, train_dataset=features, data_collator=data_collator)
    with pytest.raises((ValueError, TypeError)):  # what a plain Seq2SeqTrainer run meets at its first batch
        next(iter(plain.get_train_dataloader()))
    with pytest.raises(ValueError, match=r"syntax fields \['word_ids', 'head_word_ids'.*"
                                         r"data_collator=MgsaDataCollator\(processor.tokenizer, model=model\)"):
        MgsaSeq2SeqTrainer(model=model, args=args, train_dataset=features, data_collator=data_collator)
    with pytest.raises(ValueError, match="The evaluation dataset holds the processor's syntax fields"):
        MgsaSeq2SeqTrainer(model=model, args=args, eval_dataset=features, data_collator=data_collator)
    tokens_only = [{key: row[key] for key in ("input_ids", "attention_mask", "labels")} for row in features]
    MgsaSeq2SeqTrainer(model=model, args=args, train_dataset=tokens_only, data_collator=data_collator)


def test_encoder_token_spread_tells_a_collapsed_encoder(multi30k_processor, tiny_config, multi30k_val):
    """A new model's encoder keeps its tokens apart; with the last layer's output norm at zero weight every token
    leaves the encoder as the norm's bias (one vector): spread 0, as when the bias is zero too. The model's training
    mode is restored."""
    from mgsa_hf.evaluation import encoder_token_spread

    sources, targets = multi30k_val
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "phrase_memory")).train()
    collator = MgsaDataCollator(tokenizer=multi30k_processor.tokenizer, model=model)
    encoding = multi30k_processor(sources, text_target=targets)
    batch = collator([{key: encoding[key][i] for key in encoding} for i in range(len(sources))])
    assert encoder_token_spread(model, batch) > 0.5
    assert model.training
    with torch.no_grad():
        model.get_encoder().layers[-1].final_layer_norm.weight.zero_()
    assert encoder_token_spread(model, batch) == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        model.get_encoder().layers[-1].final_layer_norm.bias.zero_()
    assert encoder_token_spread(model, batch) == 0.0
