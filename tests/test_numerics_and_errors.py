"""Numbers that are right or loud, and errors that name what to fix: a batch without target tokens trains nothing
(no NaN), weights holding NaN/inf are reported, a fine-tuned model keeps its sinusoidal positions fixed, and wrong
inputs, files and lengths are refused with an error naming the field or the file."""

import gzip
import json
import logging
import re
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_DIR
from transformers import Seq2SeqTrainingArguments
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

from mgsa_hf import (
    MgsaDataCollator,
    MgsaForConditionalGeneration,
    MgsaProcessor,
    MgsaSeq2SeqTrainer,
    MgsaT5ForConditionalGeneration,
)
from mgsa_hf.evaluation import decode_token_ids
from mgsa_hf.tokenization_utils import read_lines
from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.ownership import run_folder
from mgsa_hf.training.run import train


REPO = Path(__file__).resolve().parents[1]
DATA = MULTI30K_DIR
TINY = REPO / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"

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


def make_model(processor, tiny_config, tiny_t5_config, backbone: str, **fields):
    torch.manual_seed(0)
    if backbone == "marian":
        return MgsaForConditionalGeneration(tiny_config(processor, "transformer", encoder_layers=1, **fields)).eval()
    return MgsaT5ForConditionalGeneration(tiny_t5_config(processor, "transformer", **fields)).eval()


def position_tables(model) -> list[torch.nn.Parameter]:
    return [module.weight for module in model.modules() if isinstance(module, MarianSinusoidalPositionalEmbedding)]


# --- the saved fine-tuned folder is the model that was scored ---


def test_reloaded_model_keeps_its_sinusoidal_positions_fixed(multi30k_processor, tiny_config, features, tmp_path):
    """A model loaded with `from_pretrained` has its sinusoidal tables fixed, as a fresh model has them: the Trainer's
    optimizer leaves them out and training leaves them as the sinusoid a reload rebuilds (before, they trained and
    the saved folder translated otherwise)."""
    model = make_model(multi30k_processor, tiny_config, None, "marian")
    assert all(not table.requires_grad for table in position_tables(model))
    model.save_pretrained(tmp_path / "saved")
    loaded = MgsaForConditionalGeneration.from_pretrained(tmp_path / "saved")
    tables = position_tables(loaded)
    assert len(tables) == 2 and all(not table.requires_grad for table in tables)
    sinusoids = [table.detach().clone() for table in tables]

    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=3,
                                    report_to="none", use_cpu=True, save_strategy="no", learning_rate=0.05)
    trainer = MgsaSeq2SeqTrainer(model=loaded, args=args, train_dataset=features,
                                 data_collator=MgsaDataCollator(multi30k_processor.tokenizer, model=loaded))
    trainer.train()
    optimized = {id(parameter) for group in trainer.optimizer.param_groups for parameter in group["params"]}
    assert not any(id(table) in optimized for table in tables)
    assert all(torch.equal(table, sinusoid) for table, sinusoid in zip(tables, sinusoids, strict=True))


def test_finetuned_folder_translates_as_scored(tmp_path):
    """`mgsa-hf train` with `init_from` (a fine-tune) for a few steps: the saved folder, loaded again, computes the
    logits of the model the run scored and translates the test split exactly as the run scored it
    (`<output_dir>-run/test.hyp.de`). Before, the fine-tune trained the sinusoidal tables, which the save leaves out
    and the reload rebuilds (the tiny model's translations are too uniform to show it; its logits do)."""
    base, finetuned = tmp_path / "base", tmp_path / "finetuned"
    common = [f"data={DATA}", "training.eval_strategy=no", "training.save_strategy=no", "splits.validation=null",
              "max_test_samples=8"]
    train(load_train_config(TINY, [*common, f"output_dir={base}", "training.max_steps=2"]))
    _, scored_model = train(load_train_config(TINY, [*common, f"output_dir={finetuned}", f"init_from={base}",
                                                     "training.max_steps=4"]))
    scored = (run_folder(finetuned) / "test.hyp.de").read_text().splitlines()

    model = MgsaForConditionalGeneration.from_pretrained(finetuned).eval()
    processor = MgsaProcessor.from_pretrained(finetuned)
    sources = list(read_lines(DATA / "test_2016_flickr.en.gz", 8))
    batch = processor(sources, truncation=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**batch)
        decoder_input_ids = torch.zeros_like(batch["input_ids"][:, :6]) + model.config.decoder_start_token_id
        logits = [m.eval()(**batch, decoder_input_ids=decoder_input_ids).logits for m in (scored_model, model)]
    torch.testing.assert_close(logits[1], logits[0])
    assert decode_token_ids(processor.tokenizer, generated) == scored


def test_averaging_loads_checkpoints_strictly(multi30k_processor, tiny_config, tmp_path):
    """Averaged weights load only when they are this model's: the weights a save leaves out (sinusoids, tied head) may
    be missing, any other weight missing or unknown is an error naming it, with the model left unchanged."""
    model = make_model(multi30k_processor, tiny_config, None, "marian")
    model.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    from mgsa_hf.evaluation import load_checkpoint_state

    state = load_file(tmp_path / "model.safetensors")
    load_checkpoint_state(model, state, "checkpoint-2")
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    name = "model.encoder.layers.0.fc1.weight"
    with pytest.raises(ValueError, match=rf"checkpoint-2 lacks {re.escape(name)}: it is not a checkpoint of"):
        load_checkpoint_state(model, {key: value for key, value in state.items() if key != name}, "checkpoint-2")
    with pytest.raises(ValueError, match=r"holds weights the model has not: model.encoder.layers.5.fc1.weight"):
        load_checkpoint_state(model, {**state, "model.encoder.layers.5.fc1.weight": state[name]}, "checkpoint-2")
    assert all(torch.equal(tensor, before[key]) for key, tensor in model.state_dict().items())


# --- weights that are not numbers ---


@pytest.mark.parametrize("backbone", ["marian", "t5"])
def test_weights_holding_nan_are_named_at_load_and_generate(multi30k_processor, tiny_config, tiny_t5_config,
                                                            tmp_path, caplog, backbone):
    model = make_model(multi30k_processor, tiny_config, tiny_t5_config, backbone)
    name, parameter = next((name, p) for name, p in model.named_parameters() if name.endswith("fc1.weight")
                           or name.endswith("DenseReluDense.wi.weight"))
    with torch.no_grad():
        parameter[0, 0] = float("nan")
    model.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = type(model).from_pretrained(tmp_path)
    assert re.search(rf"loading {re.escape(str(tmp_path))}: 1 weight tensor.* NaN or inf .*{re.escape(name)}",
                     caplog.text)
    caplog.clear()
    inputs = multi30k_processor.tokenizer(["A dog runs."], return_tensors="pt")
    with caplog.at_level(logging.WARNING):
        loaded.generate(**inputs, max_new_tokens=3)
    assert re.search(rf"generate: 1 weight tensor.*{re.escape(name)}", caplog.text)

    # weights that turn NaN after a check (a diverged training step) are read again at the next `generate`
    fresh = make_model(multi30k_processor, tiny_config, tiny_t5_config, backbone)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        fresh.generate(**inputs, max_new_tokens=2)
        assert "NaN or inf" not in caplog.text
        with torch.no_grad():
            fresh.get_input_embeddings().weight[3, 1] = float("inf")
        fresh.generate(**inputs, max_new_tokens=2)
    assert re.search(r"generate: 1 weight tensor.*\(\S*shared.weight\)", caplog.text)


# --- errors that name what to fix ---


@pytest.mark.parametrize("backbone", ["marian", "t5"])
def test_token_ids_beyond_the_vocabulary(multi30k_processor, tiny_config, tiny_t5_config, backbone):
    model = make_model(multi30k_processor, tiny_config, tiny_t5_config, backbone)
    vocab_size = model.get_input_embeddings().num_embeddings
    ids = torch.tensor([[5, vocab_size + 7, 0]])
    with pytest.raises(ValueError, match=rf"`input_ids` holds the token id {vocab_size + 7}, but .*`vocab_size` = "
                                         rf"{vocab_size}"):
        model(input_ids=ids, labels=torch.tensor([[5, 6]]))
    with pytest.raises(ValueError, match=rf"`input_ids` holds the token id {vocab_size + 7}"):
        model.generate(input_ids=ids, max_new_tokens=2)
    with pytest.raises(ValueError, match=rf"`decoder_input_ids \(or labels\)` holds the token id {vocab_size}"):
        model(input_ids=torch.tensor([[5, 0]]), labels=torch.tensor([[5, vocab_size, 0]]))


@pytest.mark.parametrize("backbone", ["marian", "t5"])
@pytest.mark.parametrize(("input_ids", "error", "match"), [
    ([[5, 6, 0]], TypeError, r"`input_ids` must be a 2-d LongTensor batch .* got a list"),
    (torch.tensor([5, 6, 0]), ValueError, r"got a tensor of shape \(3,\) \(one sentence: `ids.unsqueeze\(0\)`\)"),
    (torch.tensor([[5.0, 6.0]]), TypeError, r"got a torch.float32 tensor"),
])
def test_input_ids_that_are_no_batch(multi30k_processor, tiny_config, tiny_t5_config, backbone, input_ids, error,
                                     match):
    """A list or a 1-d tensor as `input_ids` failed with an `AttributeError` / `IndexError` inside the model."""
    model = make_model(multi30k_processor, tiny_config, tiny_t5_config, backbone)
    with pytest.raises(error, match=match):
        model(input_ids=input_ids, decoder_input_ids=torch.tensor([[0]]))
    with pytest.raises(error, match=match):
        model.generate(input_ids=input_ids, max_new_tokens=2)


def test_pipeline_with_a_tokenizer_larger_than_the_vocabulary(multi30k_processor, tiny_config, tmp_path):
    """A folder whose tokenizer has more tokens than its model embeds: the processor's load refuses it, naming the
    tokenizer file, the two sizes and the config (it embedded out-of-range ids)."""
    from transformers import pipeline

    vocab_size = len(multi30k_processor.tokenizer) - 100
    config = tiny_config(multi30k_processor, "transformer", encoder_layers=1)
    config.vocab_size = config.decoder_vocab_size = vocab_size
    MgsaForConditionalGeneration(config).save_pretrained(tmp_path)
    MgsaProcessor(multi30k_processor.tokenizer, with_syntax=False).save_pretrained(tmp_path)
    refused = (rf"tokenizer\.json holds {vocab_size + 100} tokens, more than the {vocab_size} the model embeds "
               rf"\(`vocab_size` in .*config\.json\)")
    with pytest.raises(ValueError, match=refused):
        pipeline("translation", model=str(tmp_path), device="cpu")


def test_generation_length_beyond_the_positions(multi30k_processor, tiny_config, tiny_t5_config):
    """`max_length=1e9` in a generation config allocated tens of gigabytes; lengths the positions cannot hold are
    refused, naming where the length came from. T5's relative positions have no limit."""
    model = make_model(multi30k_processor, tiny_config, None, "marian")  # 128 positions
    inputs = multi30k_processor.tokenizer(["A dog runs."], return_tensors="pt")
    with pytest.raises(ValueError, match=r"`max_length` = 1000000000 is beyond the model's positions: .*"
                                         r"`max_position_embeddings` = 128.*`max_new_tokens` can be at most 128"):
        model.generate(**inputs, max_length=10**9)
    with pytest.raises(ValueError, match=r"`max_new_tokens` = 129 is beyond"):
        model.generate(**inputs, max_new_tokens=129)
    model.generation_config.max_length = 10**9
    with pytest.raises(ValueError, match=r"`model.generation_config.max_length` = 1000000000 is beyond"):
        model.generate(**inputs)
    assert model.generate(**inputs, max_new_tokens=2, min_new_tokens=2).shape == (1, 3)  # max_new_tokens first
    t5 = make_model(multi30k_processor, None, tiny_t5_config, "t5")
    assert t5.generate(**inputs, max_new_tokens=140, min_new_tokens=140).shape == (1, 141)


def test_collator_row_with_a_text_field(multi30k_processor, features):
    rows = [dict(row) for row in features[:3]]
    rows[1]["translation"] = "Ein Hund rennt."
    rows[2]["translation"] = "Zwei Hunde."
    rows[0]["translation"] = [0.5]
    collator = MgsaDataCollator(multi30k_processor.tokenizer)
    with pytest.raises(ValueError, match=r"`translation` of rows \[1, 2\] holds text \('Ein Hund rennt.'\).*"
                                         r"remove_columns\(\['translation'\]\)"):
        collator(rows)


@pytest.mark.parametrize("damage", ["cut short", "not gzipped", "other JSON"])
def test_damaged_tree_model_file_is_named(multi30k_processor, tmp_path, damage):
    multi30k_processor.save_pretrained(tmp_path)  # trees from the learned conversion: its model file is saved too
    model_file = tmp_path / "constituency_conversion.json.gz"
    assert model_file.is_file()
    if damage == "cut short":
        model_file.write_bytes(model_file.read_bytes()[:300])
    elif damage == "not gzipped":
        model_file.write_text("{}")
    else:
        model_file.write_bytes(gzip.compress(json.dumps({"classes": []}).encode()))
    with pytest.raises(OSError, match=rf"The tree model file {re.escape(str(model_file))} is damaged"):
        MgsaProcessor.from_pretrained(tmp_path)(["A dog runs in the park."])


def fake_checkpoint(folder: Path, step: int, trainer_state: str | None = None) -> Path:
    """A checkpoint folder holding every file resuming reads (their contents do not matter to the check)."""
    checkpoint = folder / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (checkpoint / name).write_bytes(b"x")
    state = json.dumps({"global_step": step}) if trainer_state is None else trainer_state
    (checkpoint / "trainer_state.json").write_text(state)
    return checkpoint


@pytest.mark.parametrize("trainer_state", ["", "{\"global_step\": 4, \"log_hi", "[]"])
def test_damaged_trainer_state_of_the_newest_checkpoint(multi30k_processor, tiny_config, tmp_path, caplog,
                                                        trainer_state):
    """An empty or cut `trainer_state.json` in the newest checkpoint: `resume_from_checkpoint=True` resumes from the
    previous complete one with a warning naming the file; named explicitly, an error naming the file (before, a bare
    `JSONDecodeError` from inside the Trainer)."""
    model = make_model(multi30k_processor, tiny_config, None, "marian")
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = MgsaSeq2SeqTrainer(model=model, args=args)
    complete = fake_checkpoint(tmp_path, 2)
    damaged = fake_checkpoint(tmp_path, 4, trainer_state)
    state_file = re.escape(str(damaged / "trainer_state.json"))
    with caplog.at_level(logging.WARNING, logger="mgsa_hf"):
        assert trainer._checkpoint_to_resume(True) == str(complete)
    assert re.search(rf"resuming from .*checkpoint-2.*skipped.*checkpoint-4 lacks a readable trainer_state.json "
                     rf"\({state_file}", caplog.text)
    with pytest.raises(ValueError, match=rf"checkpoint-4' lacks a readable trainer_state.json \({state_file}"):
        trainer._checkpoint_to_resume(str(damaged))
