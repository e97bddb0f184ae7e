"""Bad input gets a clear error naming the argument (or a documented sane result), never a crash deep inside torch or
spaCy: the processor, `syntax()`, and forward/generate of every encoder type."""

import pytest
import torch

from mgsa_hf import MgsaForConditionalGeneration, MgsaProcessor


ENCODER_TYPES = ["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"]


@pytest.mark.parametrize(
    ("text", "error", "match"),
    [
        (None, TypeError, "text"),
        (3, TypeError, "text"),
        (b"bytes", TypeError, "text"),
        ([["nested"]], TypeError, r"text\[0\]"),
        ([], ValueError, "empty list"),
        (["fine", "\ud800"], ValueError, r"text\[1\].*not valid Unicode.*surrogate"),
        ("x" * 1_000_001, ValueError, r"text\[0\] has 1,000,001 characters.*split it"),
    ],
)
def test_bad_text(multi30k_processor, text, error, match):
    with pytest.raises(error, match=match):
        multi30k_processor(text)


@pytest.mark.parametrize("name", ["max_length", "max_target_length", "pad_to_multiple_of"])
@pytest.mark.parametrize("value", [-1, 0, 2.5, True])
def test_bad_lengths(multi30k_processor, name, value):
    with pytest.raises(ValueError, match=name):
        multi30k_processor(["A dog runs."], text_target=["Ein Hund rennt."], **{name: value})


def test_a_python_package_that_is_no_pipeline(multi30k_processor):
    processor = MgsaProcessor(multi30k_processor.tokenizer, parser_name="spacy")
    with pytest.raises(ValueError, match="parser_name='spacy'.*not a spaCy pipeline"):
        processor(["A dog runs."])


def test_pipeline_that_is_not_installed(multi30k_processor):
    processor = MgsaProcessor(multi30k_processor.tokenizer, parser_name="xx_no_such_pipeline")
    with pytest.raises(OSError, match="not installed.*pip install xx_no_such_pipeline"):
        processor(["A dog runs."])


@pytest.mark.parametrize("encoder_type", ENCODER_TYPES)
def test_over_long_text_without_truncation(multi30k_processor, tiny_config, encoder_type):
    """A 1000-word sentence: truncated with its syntax fields when `truncation=True`; without truncation the model
    raises a clear error naming `truncation=True` and its limit."""
    config = tiny_config(multi30k_processor, encoder_type, encoder_layers=1, phrase_memory_layers=[0],
                         hybrid_layers=[0], rhe_layers=[0])
    model = MgsaForConditionalGeneration(config).eval()
    text = " ".join(["a dog runs in the park ."] * 170)  # 1020 words
    truncated = multi30k_processor([text], max_length=128, truncation=True, return_tensors="pt")
    assert truncated["input_ids"].shape[1] == 128
    assert all(value.shape[-1] == 128 for value in truncated.values())
    with torch.no_grad():
        model.generate(**truncated, max_new_tokens=3)
    full = multi30k_processor([text], return_tensors="pt")
    assert full["input_ids"].shape[1] > 128
    with pytest.raises(ValueError, match=r"max_position_embeddings` = 128.*truncation=True, max_length=128"):
        with torch.no_grad():
            model.generate(**full, max_new_tokens=3)


ALIGNMENT_TEXTS = [
    "The ﬁrst ＡＢＣ dogs run… past a café.",
    "A dog </s> runs fast.",
    "Ein Hund läuft, собака бежит, 犬が走る and كلب يجري too.",
]


@pytest.mark.parametrize("processor_name", ["multi30k_processor", "marian_processor"])
@pytest.mark.parametrize("text", ALIGNMENT_TEXTS)
def test_every_subword_points_at_its_word(request, processor_name, text):
    """Text that NFKC normalisation changes, a literal `</s>` and mixed scripts, through the fast unigram and the
    Marian (SentencePiece) tokenizers: each content token's `word_ids` entry names a word its characters belong to
    (its NFKC surface lies inside that word's, or the word inside a token that spans several), in order."""
    import unicodedata

    processor = request.getfixturevalue(processor_name)
    encoding = processor(text)
    words = [unicodedata.normalize("NFKC", word) for word in processor.syntax(text).words]
    pieces = processor.tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    checked, previous = 0, -1
    for piece, word in zip(pieces, encoding["word_ids"], strict=True):
        surface = unicodedata.normalize("NFKC", piece.replace("\u2581", "")).strip()
        if word < 0 or not surface or piece in processor.tokenizer.all_special_tokens:
            continue
        assert surface in words[word] or words[word] in surface, (piece, word, words)
        assert word >= previous, "word indices run left to right"
        previous, checked = word, checked + 1
    assert checked >= len(words) // 2


@pytest.mark.parametrize("text", ["</s>", "A dog </s> runs <pad> fast."])
def test_special_token_written_in_the_text_is_text(marian_processor, text):
    """A literal `</s>` or `<pad>` in a source is text for a SentencePiece (opus-mt) tokenizer: only the appended EOS
    is special, where the tokenizer alone reads the literal as EOS or padding in the middle of the sentence."""
    tokenizer = marian_processor.tokenizer
    assert tokenizer(text)["input_ids"].count(tokenizer.eos_token_id) > 1  # the trap
    ids = marian_processor(text)["input_ids"]
    assert ids.count(tokenizer.eos_token_id) == 1 and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.pad_token_id not in ids


@pytest.mark.parametrize("processor_name", ["multi30k_processor", "marian_processor"])
def test_alignment_does_not_depend_on_normalisation(request, processor_name):
    """The same sentence written with characters NFKC changes and already normalised: the same tokens and the same
    word of each token."""
    import unicodedata

    processor = request.getfixturevalue(processor_name)
    text = ALIGNMENT_TEXTS[0]
    raw, normalized = processor(text), processor(unicodedata.normalize("NFKC", text))
    assert raw["input_ids"] == normalized["input_ids"]
    assert raw["word_ids"] == normalized["word_ids"]


@pytest.mark.parametrize("encoder_type", ENCODER_TYPES)
def test_attention_backends_run_or_say_which_they_support(multi30k_processor, multi30k_val, tiny_config,
                                                          encoder_type):
    """eager and sdpa give the same loss for every encoder type; flex attention runs or raises a ValueError naming
    the backends the variant supports, never a crash inside the kernel."""
    config = tiny_config(multi30k_processor, encoder_type, dropout=0.0, attention_dropout=0.0)
    sources, targets = (sentences[:3] for sentences in multi30k_val)
    batch = dict(multi30k_processor(sources, text_target=targets, return_tensors="pt"))
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(config).eval()
    losses = {}
    for backend in ("eager", "sdpa"):
        model.set_attn_implementation(backend)
        with torch.no_grad():
            losses[backend] = model(**batch).loss
    torch.testing.assert_close(losses["eager"], losses["sdpa"], atol=1e-5, rtol=1e-5)
    try:
        model.set_attn_implementation("flex_attention")
    except (ValueError, ImportError) as error:  # transformers refuses the backend on this machine
        pytest.skip(f"flex attention unavailable here: {error}")
    try:
        with torch.no_grad():
            flex = model(**batch).loss
    except ValueError as error:
        assert encoder_type in ("phrase_memory", "hybrid"), error
        assert "runs with attn_implementation in ['eager', 'sdpa']" in str(error)
    else:
        assert encoder_type not in ("phrase_memory", "hybrid")
        torch.testing.assert_close(flex, losses["sdpa"], atol=1e-4, rtol=1e-4)


# --- training runs: resume, checkpoints, CLI paths ---
# `mgsa-hf train`'s run folder (resuming, torn checkpoints, its tokenizer), its settings, and the scripts' paths.

import argparse
import importlib.util
import json
import logging
import re
import shutil
from pathlib import Path


TRAIN_REPO = Path(__file__).resolve().parents[1]
TINY_TRAIN_CONFIG = TRAIN_REPO / "configs" / "train" / "tiny.yaml"


def tiny_run_config(output_dir, *overrides):
    """The tiny recipe without evaluation, a checkpoint every step."""
    from mgsa_hf.training import load_train_config

    return load_train_config(TINY_TRAIN_CONFIG, [
        f"data={TRAIN_REPO.parent / 'shared' / 'data' / 'multi30k'}", f"output_dir={output_dir}",
        "training.eval_strategy=no", "training.save_steps=1", "training.logging_steps=2", *overrides])


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, TRAIN_REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory, one_thread):
    """A tiny run of 2 steps with checkpoint-1 and checkpoint-2: (results, model folder)."""
    from mgsa_hf.training import train

    folder = tmp_path_factory.mktemp("two_steps") / "model"
    results, _ = train(tiny_run_config(folder, "training.max_steps=2"))
    return results, folder


@pytest.fixture
def copied_run(two_step_run, tmp_path):
    """A copy of the two-step run's model and run folders: (results, model folder, checkpoints folder)."""
    from mgsa_hf.training import run_folder

    results, folder = two_step_run
    shutil.copytree(folder, tmp_path / "model")
    shutil.copytree(run_folder(folder), run_folder(tmp_path / "model"))
    return results, tmp_path / "model", run_folder(tmp_path / "model") / "checkpoints"


@pytest.mark.parametrize("run_folder_state", ["absent", "without checkpoints"])
def test_resume_true_without_a_checkpoint(tmp_path, run_folder_state):
    """`resume_from_checkpoint=true` (the CLI path) with no checkpoint to resume: an error naming the folder, before
    any work, not a run from scratch."""
    from mgsa_hf.training import run_folder, run_train

    checkpoints = run_folder(tmp_path / "model") / "checkpoints"
    if run_folder_state == "without checkpoints":
        checkpoints.mkdir(parents=True)
    overrides = [f"data={TRAIN_REPO.parent / 'shared' / 'data' / 'multi30k'}", f"output_dir={tmp_path / 'model'}",
                 "training.max_steps=1", "resume_from_checkpoint=true"]
    with pytest.raises(FileNotFoundError, match=rf"resume_from_checkpoint=true: .*no checkpoint.* in {checkpoints}"):
        run_train(argparse.Namespace(config=str(TINY_TRAIN_CONFIG), overrides=overrides))
    assert not (run_folder(tmp_path / "model") / "tokenizer").exists()


@pytest.mark.parametrize("removed", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_resume_from_a_torn_checkpoint(copied_run, removed):
    """A checkpoint that lacks its optimizer, schedule or random state, given as the one to resume: an error naming
    the missing file (the Trainer would go on with a fresh one)."""
    from mgsa_hf.training import train

    _, folder, checkpoints = copied_run
    (checkpoints / "checkpoint-2" / removed).unlink()
    with pytest.raises(ValueError, match=rf"resume_from_checkpoint='.*checkpoint-2' lacks {re.escape(removed)}"):
        train(tiny_run_config(folder, "training.max_steps=2",
                              f"resume_from_checkpoint={checkpoints / 'checkpoint-2'}"))


def test_resume_true_skips_a_torn_last_checkpoint(copied_run, caplog):
    """`resume_from_checkpoint=true` with the last checkpoint torn: resumes from the newest complete one, warning
    which it skipped and why, and trains the steps after it."""
    from mgsa_hf.training import train

    _, folder, checkpoints = copied_run
    (checkpoints / "checkpoint-2" / "optimizer.pt").unlink()
    with caplog.at_level(logging.WARNING, logger="mgsa_hf"):
        results, _ = train(tiny_run_config(folder, "training.max_steps=2", "resume_from_checkpoint=true"))
    assert re.search(r"resuming from .*checkpoint-1.*skipped.*checkpoint-2 lacks optimizer\.pt", caplog.text)
    assert results["global_step"] == 2 and (checkpoints / "checkpoint-2" / "optimizer.pt").is_file()


def test_resumed_run_reports_the_whole_runs_train_loss(two_step_run, copied_run):
    """Resumed after step 1, the run's `train_loss` (results.json) is the mean over both steps, as the uninterrupted
    run's, not the mean of the steps after the resume."""
    from mgsa_hf.training import run_folder, train

    uninterrupted, folder, checkpoints = copied_run
    shutil.rmtree(checkpoints / "checkpoint-2")
    results, _ = train(tiny_run_config(folder, "training.max_steps=2", "resume_from_checkpoint=true"))
    assert results["global_step"] == 2
    assert results["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-5)
    saved = json.loads((run_folder(folder) / "results.json").read_text())
    assert saved["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-5)


@pytest.mark.parametrize("value", ["-1", "1.5", "true", "all"])
def test_bad_average_last_checkpoints(tmp_path, value):
    from mgsa_hf.training import run_folder, train

    with pytest.raises(ValueError, match=r"`average_last_checkpoints` must be a whole number >= 0.*got"):
        train(tiny_run_config(tmp_path / "model", "training.max_steps=1", f"average_last_checkpoints={value}"))
    assert not run_folder(tmp_path / "model").exists()


def test_rerun_with_another_vocab_size(copied_run):
    """A second run in the same `output_dir` with another `vocab_size`: resuming stops, naming the change (the
    checkpoints embed the earlier vocabulary); starting again trains the vocabulary again instead of reusing it."""
    from transformers import AutoTokenizer

    from mgsa_hf.training import run_folder, train

    _, folder, _ = copied_run
    earlier = len(AutoTokenizer.from_pretrained(run_folder(folder) / "tokenizer"))
    with pytest.raises(ValueError, match=r"tokenizer in .* other settings \(vocab_size=300 → 120\).*resume"):
        train(tiny_run_config(folder, "training.max_steps=2", "vocab_size=120", "resume_from_checkpoint=true"))
    _, model = train(tiny_run_config(folder, "training.max_steps=1", "vocab_size=120"))
    retrained = len(AutoTokenizer.from_pretrained(run_folder(folder) / "tokenizer"))
    assert retrained <= 120 < earlier
    assert model.config.vocab_size == retrained


@pytest.mark.parametrize("key", ["tokenizer", "init_from"])
@pytest.mark.parametrize("path", ["./no-such-folder", "/no/such/folder", "runs/a/b", "runs/missing"])
def test_missing_local_folder_for_a_model_or_tokenizer(tmp_path, monkeypatch, key, path):
    """A local folder that does not exist: an error naming the setting and the path, before any work (not the Hub
    client's `Repo id must be in the form ...`). `runs/missing` is a local path because `runs/` exists here; a Hub id
    (`org/name`) still goes to the Hub."""
    import transformers

    from mgsa_hf.training import run_folder, train

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(FileNotFoundError, match=rf"{key}='{re.escape(path)}': no such folder"):
        train(tiny_run_config(tmp_path / "model", f"{key}={path}"))
    assert not run_folder(tmp_path / "model").exists()

    def from_the_hub(name, *args, **kwargs):
        raise OSError(f"asked the Hub for {name}")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_the_hub)
    with pytest.raises(ValueError, match="asked the Hub for someorg/some-model"):
        train(tiny_run_config(tmp_path / "model", f"{key}=someorg/some-model"))


@pytest.mark.parametrize("path", ["./no-such-model", "/no/such/model", "a/b/c"])
def test_convert_marian_with_a_missing_folder(tmp_path, path):
    convert_marian = load_script("convert_marian")
    with pytest.raises(SystemExit, match=rf"marian='{re.escape(path)}': no such folder"):
        convert_marian.main([path, str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("max_steps", "abc", r"`training\.max_steps` must be a whole number.*'abc'"),
        ("max_steps", "2.5", r"`training\.max_steps` must be a whole number.*2\.5"),
        ("learning_rate", "fast", r"`training\.learning_rate` must be a number.*'fast'"),
        ("per_device_train_batch_size", "[4]", r"`training\.per_device_train_batch_size` must be a whole number"),
        ("disable_tqdm", "maybe", r"`training\.disable_tqdm` must be true or false.*'maybe'"),
        ("eval_strategy", "sometimes", r"`training\.eval_strategy` must be one of \['no', 'steps', 'epoch'\]"),
    ],
)
def test_wrongly_typed_training_value(tmp_path, key, value, match):
    """A `training` value of the wrong type fails before any work, naming the key, as transformers' own command-line
    parser of `Seq2SeqTrainingArguments` would (not deep inside the Trainer)."""
    from mgsa_hf.training import run_folder, train

    with pytest.raises(ValueError, match=match):
        train(tiny_run_config(tmp_path / "model", f"training.{key}={value}"))
    assert not run_folder(tmp_path / "model").exists()


@pytest.mark.parametrize("arguments", [["--jobs", "0"], ["--jobs", "-2"], ["--threads", "0"]])
def test_bench_quality_needs_at_least_one_job(capsys, arguments):
    """`--jobs 0` would start no run and wait for one forever: argparse refuses it, naming the option."""
    bench_quality = load_script("bench_quality")
    with pytest.raises(SystemExit):
        bench_quality.parse_args(["train", "--budget", "dry-run", *arguments])
    assert f"argument {arguments[0]}:" in capsys.readouterr().err
