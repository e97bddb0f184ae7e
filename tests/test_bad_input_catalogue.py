"""Bad input a careful user or an unlucky operator gives, one test per kind of damage: each gets one clear error
naming the file or key. Before, each was a silent wrong result (a recipe value taken unchecked, an empty recipe that
trained every default), a failure once training was done, or a page of tracebacks naming no file."""

import pytest
import torch
from conftest import cli_error, tiny_sizes

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration, MgsaProcessor, MgsaT5Config
from mgsa_hf.tokenization_utils import train_joint_tokenizer
from mgsa_hf.training.config import load_train_config, validate_model_section


pytestmark = pytest.mark.usefixtures("one_thread")

PAIRS = [
    ("A man rides a bike down the street.", "Ein Mann fährt mit dem Fahrrad die Straße entlang."),
    ("Two dogs are playing in the snow.", "Zwei Hunde spielen im Schnee."),
    ("Children play soccer in a park.", "Kinder spielen Fußball in einem Park."),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved tiny transformer with its processor, and a file of source lines: `(folder, input_file)`."""
    root = tmp_path_factory.mktemp("catalogue")
    for lang, column in (("en", 0), ("de", 1)):
        (root / f"text.{lang}").write_text("\n".join(pair[column] for pair in PAIRS) + "\n", encoding="utf-8")
    tokenizer = train_joint_tokenizer(root / "text.en", root / "text.de", root / "tokenizer", vocab_size=100)
    processor = MgsaProcessor(tokenizer)
    torch.manual_seed(0)
    config = MgsaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                        decoder_start_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        encoder_type="transformer", num_phrase_tags=len(processor.phrase_tags),
                        **tiny_sizes(encoder_layers=1))
    model = MgsaForConditionalGeneration(config)
    model.generation_config.num_beams, model.generation_config.max_new_tokens = 1, 3
    model.save_pretrained(root / "model")
    processor.save_pretrained(root / "model")
    return root / "model", root / "text.en"


def copy_of(folder, tmp_path):
    import shutil

    return shutil.copytree(folder, tmp_path / "model")


# 1. integrity records: a weights file changed since saving, read through the pipeline of `mgsa-hf translate`
@pytest.mark.parametrize("damage", ["flip", "empty"])
def test_changed_weights_are_named_on_one_line_by_translate(saved, tmp_path, damage):
    folder, sources = saved
    folder = copy_of(folder, tmp_path)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 1
    weights.write_bytes(bytes(data) if damage == "flip" else b"")
    message = cli_error(["translate", folder, "--input", sources])
    # before: "Could not load model ... See the original errors:" and two tracebacks on one line
    assert message.startswith(f"mgsa-hf translate: error: {weights} does not hold the weights that were saved"), \
        message


# 6. recipe values of the wrong type or range, refused when the recipe is loaded, naming the key
@pytest.mark.parametrize("override, error", [
    ("generation.repetition_penalty=0", "`generation.repetition_penalty` must be a number > 0"),  # failed at eval
    ("generation.repetition_penalty=abc", "`generation.repetition_penalty` must be a number > 0"),
    ("generation.do_sample=yes", "`generation.do_sample` must be true or false"),  # sampled without a word
    ("generation.diversity_penalty=abc", "`generation.diversity_penalty` must be a number"),
    ("generation.forced_eos_token_id=-5", "`generation.forced_eos_token_id` must be a token id"),
    ("generation.forced_bos_token_id=99999", "below the vocabulary's 300"),
    ("generation.bad_words_ids=abc", "`generation.bad_words_ids` must be a non-empty list of token ids"),
    ("generation.num_beam_groups=3", "`generation.num_beam_groups` (3) must divide"),  # greedy ignored it
    ("examples=[1]", "`examples` must be a list of sentences"),  # failed after training, with a traceback
])
def test_recipe_values_refused_when_loaded(override, error):
    with pytest.raises(ValueError) as refused:
        load_train_config("tiny", [override])
    assert error in str(refused.value)


def test_recipe_values_that_fit_still_load():
    config = load_train_config("tiny", [
        "generation.repetition_penalty=1.2", "generation.do_sample=false", "generation.no_repeat_ngram_size=3",
        "generation.num_beam_groups=2", "training.generation_num_beams=4", "generation.diversity_penalty=0.5",
        "generation.bad_words_ids=[[5]]", "generation.forced_eos_token_id=0", "examples=[A man rides.]"])
    assert config.generation["repetition_penalty"] == 1.2 and config.examples == ["A man rides."]
    # a fine-tuned model keeps its own vocabulary: the recipe's vocab_size bounds no token id
    config = load_train_config("tiny", ["tokenizer=Helsinki-NLP/opus-mt-en-de", "generation.forced_bos_token_id=9999"])
    assert config.generation["forced_bos_token_id"] == 9999


@pytest.mark.parametrize("make, field, name", [
    (MgsaConfig, "dropout", "dropout"), (MgsaConfig, "attention_dropout", "attention_dropout"),
    (MgsaT5Config, "dropout_rate", "dropout_rate"),
])
def test_dropout_outside_a_probability_is_refused_by_name(make, field, name):
    # before: `model.dropout=2` built the model and failed in torch, naming no key
    with pytest.raises(Exception, match=f"`{name}` must be a probability in \\[0, 1\\], got 2"):
        make(**{field: 2})
    config = load_train_config("tiny", ["model.dropout=2"])
    with pytest.raises(Exception, match="`dropout` must be a probability"):
        validate_model_section(config)


# 7. damaged and empty files: named, with the line
def test_empty_recipe_file_is_refused(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("# only a comment\n", encoding="utf-8")
    # before: an empty recipe trained the default recipe's model on the whole corpus into runs/mgsa-multi30k
    with pytest.raises(ValueError, match=f"training config {recipe} is empty"):
        load_train_config(recipe)


@pytest.mark.parametrize("content, error", [
    (b"\xff\xfe{}", "processor_config.json is damaged, line 1: not UTF-8 text"),
    (b"[1]", "processor_config.json is damaged: not a JSON object"),
])
def test_damaged_processor_config_is_named_by_translate(saved, tmp_path, content, error):
    folder, sources = saved
    folder = copy_of(folder, tmp_path)
    (folder / "processor_config.json").write_bytes(content)
    # before: "'utf-8' codec can't decode byte 0xff in position 0", naming no file
    assert error in cli_error(["translate", folder, "--input", sources])


# 2. commands that write: an output that is what the command reads
@pytest.mark.parametrize("name", ["same", "link", "dotted", "in_model"])
def test_translate_output_over_what_it_reads_is_refused(saved, tmp_path, name):
    folder, sources = saved
    folder = copy_of(folder, tmp_path)
    source = tmp_path / "sources.en"
    source.write_text("A man rides a bike.\n", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.en").symlink_to(source)
    output = {"same": source, "link": tmp_path / "link.en", "dotted": tmp_path / "sub" / ".." / "sources.en",
              "in_model": folder / "config.json"}[name]
    config = (folder / "config.json").read_bytes()
    message = cli_error(["translate", folder, "--input", source, "--output", output])
    # before: the sources (or the model's config) were replaced by the translations without a word
    assert f"--output {output}" in message and ("is the file read" in message or "lies in the model folder" in message)
    assert source.read_text(encoding="utf-8") == "A man rides a bike.\n"
    assert (folder / "config.json").read_bytes() == config


def test_train_into_a_file_is_refused_before_training(tmp_path):
    from mgsa_hf.training.config import _check_run_settings

    (tmp_path / "model").write_text("notes\n", encoding="utf-8")
    (tmp_path / "other-run").write_text("notes\n", encoding="utf-8")
    # before: the run trained, then failed saving the model into the file
    for name, error in (("model", "output_dir"), ("other", "its run folder")):
        with pytest.raises(FileExistsError, match=f"{error} {tmp_path / name}(-run)? is a file, not a folder"):
            _check_run_settings(load_train_config("tiny", [f"output_dir={tmp_path / name}"]))


# 8. resume edge cases: a recipe whose model no longer fits the run's checkpoint
def test_resume_into_a_model_of_other_sizes_names_the_sizes(saved, tmp_path):
    from transformers import Seq2SeqTrainingArguments

    from mgsa_hf.training.trainer import MgsaSeq2SeqTrainer

    folder, _ = saved
    config = MgsaConfig.from_pretrained(folder)
    config.d_model, config.encoder_ffn_dim = 48, 96
    model = MgsaForConditionalGeneration(config)
    arguments = Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    trainer = MgsaSeq2SeqTrainer(model=model, args=arguments)
    # before: torch's RuntimeError, a page of "size mismatch for ..." lines with a traceback
    with pytest.raises(ValueError, match=f"resuming from {folder}: its weights do not fit the model the recipe builds "
                                         r"\(d_model 32 -> 48, encoder_ffn_dim 64 -> 96\)"):
        trainer._load_from_checkpoint(str(folder))


# 1. a checkpoint's optimizer state with one flipped bit: torch.load read past it (or failed naming no file)
def test_flipped_bit_in_optimizer_state_is_named(saved, tmp_path):
    from transformers import Seq2SeqTrainingArguments

    from mgsa_hf.training.trainer import MgsaSeq2SeqTrainer

    folder, _ = saved
    model = MgsaForConditionalGeneration.from_pretrained(folder)
    arguments = Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    trainer = MgsaSeq2SeqTrainer(model=model, args=arguments)
    trainer.create_optimizer_and_scheduler(num_training_steps=2)
    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    torch.save(trainer.optimizer.state_dict(), checkpoint / "optimizer.pt")
    torch.save(trainer.lr_scheduler.state_dict(), checkpoint / "scheduler.pt")
    trainer._load_optimizer_and_scheduler(str(checkpoint))  # whole: loads
    data = bytearray((checkpoint / "optimizer.pt").read_bytes())
    data[len(data) // 3] ^= 1
    (checkpoint / "optimizer.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{checkpoint / 'optimizer.pt'} cannot be read .*cut short or damaged"):
        trainer._load_optimizer_and_scheduler(str(checkpoint))


# 4. an ONNX folder mixed from two exports: a tokenizer of another model gave wrong text without a word
def test_onnx_record_names_a_tokenizer_of_another_model(saved, tmp_path):
    import json
    import shutil

    from mgsa_hf.export.onnx_record import verify_onnx_record, write_onnx_record

    folder, _ = saved
    onnx = tmp_path / "onnx"
    onnx.mkdir()
    (onnx / "encoder_model.onnx").write_bytes(b"graph")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, onnx / name)
    write_onnx_record(onnx, {"encoder_type": "transformer"})
    graphs = {"encoder": "encoder_model.onnx"}
    assert "tokenizer.json" in verify_onnx_record(onnx, graphs)
    other = train_joint_tokenizer(onnx / "config.json", onnx / "config.json", tmp_path / "other", vocab_size=60)
    other.save_pretrained(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "tokenizer.json", onnx / "tokenizer.json")
    with pytest.raises(ValueError, match=f"{onnx / 'tokenizer.json'} is not the file exported with the rest"):
        verify_onnx_record(onnx, graphs)
    # a record of an earlier version, without the tokenizer's files, still loads
    record = json.loads((onnx / "onnx_record.json").read_text(encoding="utf-8"))
    del record["tokenizer_files"]
    (onnx / "onnx_record.json").write_text(json.dumps(record), encoding="utf-8")
    assert "tokenizer.json" not in verify_onnx_record(onnx, graphs)


# 5./1. the run tokenizer's record damaged: named as damaged, not as a record a stopped run never wrote
def test_damaged_tokenizer_record_is_named(tmp_path, caplog):
    from types import SimpleNamespace

    from mgsa_hf.training.corpus import load_or_train_tokenizer
    from mgsa_hf.training.ownership import run_folder

    pairs = [{"en": source, "de": target} for source, target in PAIRS * 4]
    config = SimpleNamespace(tokenizer=None, init_from=None, output_dir=tmp_path / "model", vocab_size=80,
                             source_lang="en", target_lang="de", resume_from_checkpoint=None,
                             tokenizer_max_sentences=None)
    first = load_or_train_tokenizer(config, {"translation": pairs}, corpus_key="pairs")
    record = run_folder(config.output_dir) / "tokenizer" / "trained_for.json"
    record.write_text("{", encoding="utf-8")
    with caplog.at_level("WARNING"):
        again = load_or_train_tokenizer(config, {"translation": pairs}, corpus_key="pairs")
    assert f"has a damaged record of its settings ({record})" in caplog.text
    assert again.get_vocab() == first.get_vocab()  # trained again, as before


def test_weights_file_that_is_not_safetensors_is_named(saved, tmp_path):
    folder, sources = saved
    folder = copy_of(folder, tmp_path)
    (folder / "weights.sha256").unlink()  # a folder saved before the record: nothing checks the bytes first
    (folder / "model.safetensors").write_text("not safetensors at all", encoding="utf-8")
    # before: safetensors' "Error while deserializing header: header too large", a traceback naming no file
    with pytest.raises(OSError, match=f"{folder}: model.safetensors cannot be read as safetensors"):
        MgsaForConditionalGeneration.from_pretrained(folder)
    assert "model.safetensors cannot be read as safetensors" in cli_error(["translate", folder, "--input", sources])
