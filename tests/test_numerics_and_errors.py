"""Numbers that are right or loud, and errors that name what to fix: a batch without target tokens trains nothing
(no NaN), weights holding NaN/inf are reported, a fine-tuned model keeps its sinusoidal positions fixed, and wrong
inputs, files and lengths are refused with an error naming the field or the file."""

import pytest
import torch
from transformers import Seq2SeqTrainingArguments

from mgsa_hf import MgsaDataCollator, MgsaForConditionalGeneration, MgsaSeq2SeqTrainer


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def features(multi30k_processor, multi30k_val):
    """The first 4 Multi30k val pairs as per-sentence features (every syntax field)."""
    sources, targets = (sentences[:4] for sentences in multi30k_val)
    encoding = multi30k_processor(sources, text_target=targets)
    return [{key: encoding[key][i] for key in encoding} for i in range(len(sources))]


def tag_model(tiny_config, processor, **fields):
    """A tiny MG-SA model with syntactic phrases and tag supervision (Table 3 row 4)."""
    torch.manual_seed(0)
    config = tiny_config(processor, "phrase_memory", phrase_partition="syntactic", phrase_tag_supervision=True,
                         phrase_tag_loss_weight=1.0, **fields)
    return MgsaForConditionalGeneration(config)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_batch_without_target_tokens_trains_nothing(multi30k_processor, tiny_config, features, tmp_path, smoothing):
    """A batch whose labels are all -100 has the loss 0 and a zero gradient, translation and tag loss alike, with the
    model's own loss (smoothing 0) and the Trainer's label smoother (0.1): before, 0 / 0 turned the weights NaN."""
    model = tag_model(tiny_config, multi30k_processor)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    targetless = [{**row, "labels": [-100] * len(row["labels"])} for row in features]
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), label_smoothing_factor=smoothing, per_device_train_batch_size=4, max_steps=1,
        logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", learning_rate=1e-3,
    )
    trainer = MgsaSeq2SeqTrainer(model=model, args=args, train_dataset=targetless,
                                 data_collator=MgsaDataCollator(multi30k_processor.tokenizer, model=model))
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["loss"] == 0 and logged["grad_norm"] == 0
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, before[name]), name

    model.zero_grad()
    batch = trainer.data_collator(targetless)
    loss = model(**batch).loss
    loss.backward()
    assert loss.item() == 0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
