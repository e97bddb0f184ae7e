"""The catalogue of bad inputs and faults: each gets a clear error naming the argument, field, file or line (or a
documented sane result, or a warning), never a silently wrong result, a crash deep inside torch, datasets or spaCy,
or a hang. Sections: configuration (every way a config is made); the processor, `syntax()` and forward/generate of
every encoder type; processor folders, corpora and the collator; generation, the pipeline, `mgsa-hf translate`,
model inputs and saved weights; training runs (resume, checkpoints, the CLI's paths)."""

import argparse
import copy
import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_DIR
from huggingface_hub.errors import StrictDataclassError

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration, MgsaProcessor, MgsaT5Config
from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.conversion import convert_checkpoint
from mgsa_hf.training.run import train


ENCODER_TYPES = ["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"]
REPO = Path(__file__).resolve().parents[1]


# --- configuration: every way a config is made ---
# `MgsaConfig(...)`, `from_pretrained(path, **kwargs)`, a hand-edited config.json, a config changed after construction,
# the CLI's `model.*` keys and `mgsa-hf convert --set` all reach one validation (`@strict` fields and `validate_*`).

SIZES = dict(vocab_size=60, d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
             pad_token_id=0, decoder_start_token_id=0, eos_token_id=1)
BAD_FIELDS = [  # (fields, expected error, what the message must name)
    ({"encoder_type": "RHE"}, StrictDataclassError, "encoder_type.*expected one of"),
    ({"encoder_type": "bogus"}, StrictDataclassError, "encoder_type"),
    ({"encoder_type": None}, StrictDataclassError, "encoder_type"),
    ({"encoder_type": "rhe", "rhe_layers": [5]}, StrictDataclassError, r"rhe_layers.*\[5\].*outside the encoder's 2"),
    ({"encoder_type": "hybrid", "hybrid_layers": [0.5]}, StrictDataclassError, "hybrid_layers"),
    ({"rhe_layers": 1}, StrictDataclassError, "rhe_layers.*expected a list"),
    ({"hybrid_window": -1}, StrictDataclassError, "hybrid_window.*>= 1"),
    ({"hybrid_window": "3"}, StrictDataclassError, "hybrid_window.*expected int"),
    ({"hybrid_window": True}, StrictDataclassError, "hybrid_window"),  # a bool is an int to Python
    ({"encoder_type": "rhe", "rhe_layers": [True]}, StrictDataclassError, "rhe_layers"),
    ({"d_model": True}, StrictDataclassError, "d_model"),
    ({"rhe_fixed_gate": 1.5}, StrictDataclassError, r"rhe_fixed_gate.*\[0, 1\]"),
    ({"rhe_fixed_gate": "0.5"}, StrictDataclassError, "rhe_fixed_gate"),
    ({"phrase_tag_loss_weight": -1}, StrictDataclassError, "phrase_tag_loss_weight.*>= 0"),
    ({"phrase_composition": "avg"}, StrictDataclassError, "phrase_composition.*expected one of"),
    ({"phrase_word_heads": 4}, StrictDataclassError, r"phrase_word_heads.*\[0, 4\)"),
    ({"vocab_size": 0}, StrictDataclassError, "vocab_size.*positive"),
    ({"max_position_embeddings": 0}, StrictDataclassError, "max_position_embeddings.*positive"),
    ({"d_model": 0}, StrictDataclassError, "d_model.*positive"),
    ({"encoder_type": "rhe", "rhe_layer": [1]}, ValueError, "no field `rhe_layer` \\(did you mean `rhe_layers`\\?\\)"),
    ({"hybird_window": 2}, ValueError, "did you mean `hybrid_window`"),
]


@pytest.mark.parametrize(("fields", "error", "match"), BAD_FIELDS)
def test_config_refuses(fields, error, match):
    with pytest.raises(error, match=f"(?s){match}"):
        MgsaConfig(**{**SIZES, **fields})


@pytest.mark.parametrize(("fields", "error", "match"), [
    ({"num_heads": 0}, StrictDataclassError, "num_heads.*positive"),
    ({"d_kv": 0}, StrictDataclassError, "d_kv.*positive"),
    ({"encoder_type": "rhe", "rhe_layers": [6]}, StrictDataclassError, "rhe_layers"),
    ({"pr_glanse": "max"}, ValueError, "did you mean `pr_glance`"),
])
def test_t5_config_refuses(fields, error, match):
    with pytest.raises(error, match=f"(?s){match}"):
        MgsaT5Config(num_layers=2, **fields)


@pytest.fixture(scope="module")
def saved_tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_model")
    MgsaForConditionalGeneration(MgsaConfig(**SIZES)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(("fields", "error", "match"), [row for row in BAD_FIELDS if "vocab_size" not in row[0]])
def test_from_pretrained_refuses(saved_tiny_model, fields, error, match):
    """Keyword arguments of `from_pretrained` (the README's upgrade call) are validated with the whole config."""
    with pytest.raises(error, match=f"(?s){match}"):
        MgsaForConditionalGeneration.from_pretrained(saved_tiny_model, **fields)


def test_backbone_legacy_keys_still_load(saved_tiny_model, tmp_path):
    """Keys of opus-mt `config.json`s that are no field load as transformers loads them; the checks above still run."""
    config = json.loads((saved_tiny_model / "config.json").read_text())
    config.update(static_position_embeddings=True, num_beams=4, normalize_before=False, extra_pos_embeddings=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert MgsaConfig.from_pretrained(tmp_path).encoder_type == "transformer"


@pytest.mark.parametrize(("field", "value", "match"), [
    ("encoder_type", "RHE", "encoder_type"),
    ("hybrid_window", -1, "hybrid_window"),
    ("rhe_layers", [0.5], "rhe_layers"),
])
def test_hand_edited_config_json_is_refused(saved_tiny_model, tmp_path, field, value, match):
    config = json.loads((saved_tiny_model / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(StrictDataclassError, match=match):
        MgsaConfig.from_pretrained(tmp_path)


def test_config_changed_after_construction():
    """Each assignment checks its field; the model checks the relations when it is built."""
    config = MgsaConfig(**SIZES)
    with pytest.raises(StrictDataclassError, match="encoder_type"):
        config.encoder_type = "RHE"
    config.encoder_type, config.rhe_layers = "rhe", [5]
    with pytest.raises(StrictDataclassError, match="rhe_layers"):
        MgsaForConditionalGeneration(config)


@pytest.mark.parametrize(("overrides", "error", "match"), [
    (["model.rhe_layer=[1]"], ValueError, "no field `rhe_layer`.*did you mean `rhe_layers`"),
    (["model.encoder_type=bogus"], StrictDataclassError, "encoder_type"),
    (["model.hybrid_window=-1"], StrictDataclassError, "hybrid_window"),
    (["init_from={model}", "model.encoder_type=bogus"], StrictDataclassError, "encoder_type"),
    (["init_from={model}", "model.encoder_type=rhe", "model.rhe_layers=[7]"], StrictDataclassError, "rhe_layers.*7"),
    (["init_from={model}", "model.rhe_layer=[1]"], ValueError, "did you mean `rhe_layers`"),
])
def test_train_cli_model_keys_are_checked_before_any_work(saved_tiny_model, tmp_path, overrides, error, match):
    """The corpus folder is empty: an error about its files would mean the model section was checked after work
    began."""
    overrides = [override.format(model=saved_tiny_model) for override in overrides]
    (tmp_path / "empty-corpus").mkdir()
    config = load_train_config(None, [f"data={tmp_path / 'empty-corpus'}", f"output_dir={tmp_path / 'run'}",
                                      *overrides])
    with pytest.raises(error, match=f"(?s){match}"):
        train(config)


@pytest.mark.parametrize(("arguments", "message"), [
    (["--encoder-type", "bogus"], "invalid choice: 'bogus'"),
    (["--set", "rhe_layers=[0,"], "must be JSON"),
    (["--set", "rhe_layers"], "expected FIELD=JSON"),
])
def test_convert_marian_arguments(saved_tiny_model, tmp_path, capsys, arguments, message):
    """`mgsa-hf convert` with a bad argument: a usage error or one line, and nothing written."""
    from mgsa_hf.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(saved_tiny_model), str(tmp_path / "out"), *arguments])
    assert message in f"{exit_info.value.code} {capsys.readouterr().err}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("overrides", "error", "match"), [
    ({"rhe_layer": [1]}, ValueError, "did you mean `rhe_layers`"),
    ({"encoder_type": "rhe", "rhe_layers": [7]}, StrictDataclassError, "rhe_layers"),
])
def test_convert_refuses_fields_before_writing(saved_tiny_model, tmp_path, overrides, error, match):
    with pytest.raises(error, match=f"(?s){match}"):
        convert_checkpoint(str(saved_tiny_model), str(tmp_path / "out"), **overrides)
    assert not (tmp_path / "out").exists()



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
        assert encoder_type in ("phrase_memory", "hybrid", "phrase_representation"), error
        assert "runs with attn_implementation in ['eager', 'sdpa']" in str(error)
    else:
        assert encoder_type not in ("phrase_memory", "hybrid", "phrase_representation")
        torch.testing.assert_close(flex, losses["sdpa"], atol=1e-4, rtol=1e-4)


# --- processor, corpora and collator ---
# Saved processor folders, corpus files (line ends, encodings, damaged files), the processed-corpus cache and batches
# the collator gets: each case a clear error naming the input (file and line for corpora), a warning or a correct
# result.


def _write_lines(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))


@pytest.mark.parametrize("encoder_type", ["phrase_memory", "transformer"])
def test_saved_model_folder_without_processor_config(multi30k_processor, tiny_config, tmp_path, caplog,
                                                     encoder_type):
    """A model folder saved with `tree_parser="rules", phrase_levels=2` whose `processor_config.json` is gone: the
    processor takes the model's `phrase_levels` and warns that its other settings are defaults; for a model that
    reads no syntax it only tokenizes, without a warning. Without the model's config.json (a tokenizer alone, as a
    plain opus-mt folder has) it loads with the defaults and no warning."""
    processor = MgsaProcessor(multi30k_processor.tokenizer, tree_parser="rules", phrase_levels=2)
    processor.save_pretrained(tmp_path)
    tiny_config(processor, encoder_type, phrase_levels=2).save_pretrained(tmp_path)
    (tmp_path / "processor_config.json").unlink()

    def load():
        caplog.clear()
        with caplog.at_level("WARNING"):
            loaded = MgsaProcessor.from_pretrained(tmp_path)
        return loaded, [record.getMessage() for record in caplog.records
                        if "processor_config.json" in record.getMessage()]

    loaded, warned = load()
    if encoder_type == "transformer":
        assert not loaded.with_syntax and not warned
        assert list(loaded(["A dog runs."])) == ["input_ids", "attention_mask"]
    else:
        assert loaded.phrase_levels == 2 and loaded.with_syntax
        assert len(warned) == 1 and str(tmp_path) in warned[0] and "tree_parser" in warned[0]
        assert len(loaded(["A dog runs."])["phrase_ids"][0]) == 2
    (tmp_path / "config.json").unlink()
    loaded, warned = load()
    assert (loaded.phrase_levels, loaded.with_syntax, warned) == (3, True, [])


def test_lone_carriage_return_is_text_in_corpus_lines(tmp_path):
    """A lone `\\r` inside line 4 of train.en and line 21 of train.de, and `\\r\\n` line ends: lines end at `\\n`
    only, so the 30 pairs stay aligned (universal newlines made 31 lines a side, pairs 4-20 misaligned)."""
    from mgsa_hf.training.data import load_parallel_corpus

    english = [f"sentence {number}".encode() for number in range(1, 31)]
    german = [f"Satz {number}\r".encode() for number in range(1, 31)]  # CRLF line ends
    english[3] = b"sentence\r4"
    german[20] = b"Satz\r21\r"
    _write_lines(tmp_path / "train.en", english)
    _write_lines(tmp_path / "train.de", german)
    pairs = load_parallel_corpus(tmp_path, "en", "de", {"train": "train"})["train"]["translation"]
    assert len(pairs) == 30
    assert pairs[3] == {"en": "sentence\r4", "de": "Satz 4"}
    assert pairs[20] == {"en": "sentence 21", "de": "Satz\r21"}
    assert all(pair["en"][-2:].strip() == pair["de"][-2:].strip() for pair in pairs)


def test_corpus_sides_of_different_lengths(tmp_path):
    from mgsa_hf.training.data import load_parallel_corpus

    _write_lines(tmp_path / "train.en", [b"a", b"b", b"c"])
    _write_lines(tmp_path / "train.de", [b"a", b"b"])
    with pytest.raises(ValueError, match=r"train\.en has 3 lines but .*train\.de has 2"):
        load_parallel_corpus(tmp_path, "en", "de", {"train": "train"})


def _gzip_cut_short(path):
    import gzip

    path.write_bytes(gzip.compress(b"".join(b"line %d\n" % number for number in range(1, 2000)))[:-200])


@pytest.mark.parametrize(
    ("files", "match"),
    [
        ({"train.en": b"A dog.\nA cat \xff sleeps.\n", "train.de": b"Ein Hund.\nEine Katze.\n"},
         r"train\.en, line 2: not UTF-8 text \(byte 0xff"),
        ({"train.en.gz": _gzip_cut_short, "train.de": b"x\n" * 1999},
         r"train\.en\.gz, line \d+: the gzip file cannot be decompressed"),
        ({"train.en": b"x\n", "train.de.gz": b"not gzip at all\n"},
         r"train\.de\.gz, line 1: the gzip file cannot be decompressed"),
        ({"train.jsonl": b'{"en": "A dog.", "de": "Ein Hund."}\n\n{"en": "A cat.", "de": \n'},
         r"train\.jsonl, line 3: not a JSON record"),
        ({"train.jsonl": b'{"en": "A dog.", "de": "Ein Hund."}\n{"en": "A \xe4 cat.", "de": "Katze"}\n'},
         r"train\.jsonl, line 2: not UTF-8 text"),
    ],
    ids=["invalid-utf8", "gzip-cut-short", "not-gzip", "broken-jsonl-line", "jsonl-invalid-utf8"],
)
def test_damaged_corpus_files_name_file_and_line(tmp_path, files, match):
    from mgsa_hf.training.data import load_parallel_corpus

    for name, content in files.items():
        content(tmp_path / name) if callable(content) else (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=match):
        load_parallel_corpus(tmp_path, "en", "de", {"train": "train"})


def test_lone_surrogate_in_a_plain_string(multi30k_processor):
    with pytest.raises(ValueError, match=r"`text` is not valid Unicode text.*surrogate"):
        multi30k_processor("\ud800")


@pytest.mark.parametrize("damage", ["cut in half", "fewer rows"])
def test_damaged_processed_corpus_cache_is_computed_again(multi30k_processor, multi30k_val, tmp_path, caplog, damage):
    """The `map` cache of a file-backed corpus cut short (a run stopped while writing it) or holding fewer rows: the
    next `map_dataset` warns, computes it again and gives the full result."""
    import os

    from datasets import Dataset, load_from_disk

    processor = MgsaProcessor(multi30k_processor.tokenizer, with_syntax=False)
    sources, targets = multi30k_val
    Dataset.from_dict({"en": sources * 4, "de": targets * 4}).save_to_disk(tmp_path / "corpus")
    corpus = load_from_disk(tmp_path / "corpus")
    first = processor.map_dataset(corpus, "en", "de")
    (cache_file,) = [entry["filename"] for entry in first.cache_files]
    expected = first.to_dict()
    if damage == "cut in half":
        os.truncate(cache_file, os.path.getsize(cache_file) // 2)
    else:
        first.select(range(10)).flatten_indices(cache_file_name=str(tmp_path / "part.arrow"))
        os.replace(tmp_path / "part.arrow", cache_file)
    with caplog.at_level("WARNING"):
        again = processor.map_dataset(corpus, "en", "de")
    assert again.to_dict() == expected
    assert any("processed-corpus cache" in record.getMessage() for record in caplog.records)


def test_collator_rows_with_and_without_labels(multi30k_processor):
    from mgsa_hf import MgsaDataCollator

    collator = MgsaDataCollator(multi30k_processor.tokenizer)
    with_labels = multi30k_processor("A dog runs.", text_target="Ein Hund rennt.")
    without = multi30k_processor("Two cats sleep.")
    for rows, having, missing in [([without, with_labels], r"\[1\]", r"\[0\]"),
                                  ([with_labels, without], r"\[0\]", r"\[1\]")]:
        with pytest.raises(ValueError, match=rf"rows {having} have `labels` but rows {missing} do not"):
            collator(rows)


def test_collator_rows_of_processors_with_different_phrase_levels(multi30k_processor):
    from mgsa_hf import MgsaDataCollator

    two_levels = MgsaProcessor(multi30k_processor.tokenizer, phrase_levels=2)
    rows = [multi30k_processor("A dog runs."), two_levels("Two cats sleep on a mat.")]
    with pytest.raises(ValueError, match=r"`phrase_ids` has different numbers of levels.*2 in rows \[1\]; 3 in rows "
                                         r"\[0\].*phrase_levels"):
        MgsaDataCollator(multi30k_processor.tokenizer)(rows)


@pytest.mark.parametrize(("processor_name", "removed", "match"), [
    ("multi30k_processor", "tokenizer.json", "has no tokenizer.json"),
    ("marian_processor", "source.spm", r"lacks source\.spm"),
])
def test_folder_missing_a_tokenizer_file(request, tiny_config, tmp_path, processor_name, removed, match):
    """A saved model folder whose tokenizer lost a file: loading its processor, or the translation pipeline over it,
    names the folder and the file."""
    from transformers import pipeline

    # a copy: saving a processor binds its tokenizer to it (`processor_class`), which the session's fixture must not
    processor = copy.deepcopy(request.getfixturevalue(processor_name))
    processor.save_pretrained(tmp_path)
    MgsaForConditionalGeneration(tiny_config(processor, "rhe")).save_pretrained(tmp_path)
    (tmp_path / removed).unlink()
    with pytest.raises(OSError, match=rf"{tmp_path}.* {match}"):
        MgsaProcessor.from_pretrained(tmp_path)
    with pytest.raises(OSError, match=rf"{tmp_path}.* {match}"):
        pipeline("translation", model=str(tmp_path))

# --- generation, pipeline, `mgsa-hf translate`, model inputs, saved weights ---
# Counts given to `generate`, the pipeline and `mgsa-hf translate`, the script's lines, RHE's syntax fields and the
# weights of a saved folder: each bad one gets an error naming it.

POSITIONS = 32  # max_position_embeddings of the saved tiny model below


@pytest.fixture(scope="module")
def plain_folder(tmp_path_factory, multi30k_processor, tiny_config):
    """(folder, model) of a tiny transformer with 32 positions, greedy and at most 6 new tokens, saved with a
    processor that reads no syntax."""
    folder = tmp_path_factory.mktemp("plain")
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1,
                                                     max_position_embeddings=POSITIONS, init_std=0.3)).eval()
    model.generation_config.num_beams, model.generation_config.max_new_tokens = 1, 6
    model.save_pretrained(folder)
    MgsaProcessor(multi30k_processor.tokenizer, with_syntax=False).save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def plain_translator(plain_folder):
    from transformers import pipeline

    return pipeline("translation", model=str(plain_folder[0]), device="cpu")


def run_translate_script(argv):
    """`mgsa-hf translate ARGV`."""
    from mgsa_hf.cli import main

    return main(["translate", *argv])


BAD_GENERATE_ARGUMENTS = [
    ({"num_beams": 0}, r"`num_beams` must be an integer >= 1, got 0"),
    ({"num_beams": -2}, r"`num_beams` must be an integer >= 1, got -2"),
    ({"num_beams": 2.5}, r"`num_beams` must be an integer >= 1, got 2.5"),
    ({"max_new_tokens": "5"}, r"`max_new_tokens` must be an integer >= 1, got '5'"),
    ({"num_return_sequences": 0}, r"`num_return_sequences` must be an integer >= 1, got 0"),
]


@pytest.mark.parametrize("backbone", ["marian", "t5"])
@pytest.mark.parametrize(("arguments", "match"), BAD_GENERATE_ARGUMENTS)
def test_bad_generate_counts(multi30k_processor, tiny_config, tiny_t5_config, backbone, arguments, match):
    """`generate(num_beams=0)` divided by zero, `-2` made a negative tensor size, `2.5` and `max_new_tokens="5"` failed
    in torch's `repeat_interleave` / a comparison, `num_return_sequences=0` returned one sequence anyway."""
    from mgsa_hf import MgsaT5ForConditionalGeneration

    if backbone == "marian":
        model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1))
    else:
        model = MgsaT5ForConditionalGeneration(tiny_t5_config(multi30k_processor, "transformer"))
    inputs = multi30k_processor.tokenizer(["A dog runs."], return_tensors="pt")
    with pytest.raises(ValueError, match=match):
        model.eval().generate(**inputs, **arguments)


def test_bad_count_in_the_models_generation_config(multi30k_processor, tiny_config):
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1)).eval()
    model.generation_config.num_beams = 0
    inputs = multi30k_processor.tokenizer(["A dog runs."], return_tensors="pt")
    with pytest.raises(ValueError, match=r"`model.generation_config.num_beams` must be an integer >= 1, got 0"):
        model.generate(**inputs)


@pytest.mark.parametrize("given_to", ["call", "pipeline"])
@pytest.mark.parametrize(("arguments", "match"), BAD_GENERATE_ARGUMENTS)
def test_bad_generate_counts_through_the_pipeline(plain_folder, plain_translator, given_to, arguments, match):
    from transformers import pipeline

    # transformers 5.17 puts a pipeline's generate arguments into its generation config first, which names them so
    with pytest.raises(ValueError, match=match.replace("`", r"`(?:generation_config\.)?", 1)):
        if given_to == "call":
            plain_translator(["A dog runs."], **arguments)
        else:
            pipeline("translation", model=str(plain_folder[0]), device="cpu", **arguments)(["A dog runs."])


@pytest.mark.parametrize("given_to", ["call", "pipeline"])
@pytest.mark.parametrize(("name", "value"), [("batch_size", -1), ("batch_size", 0), ("batch_size", 2.5),
                                             ("num_workers", -1)])
def test_bad_pipeline_batching(plain_folder, plain_translator, given_to, name, value):
    """`batch_size=-1` returned `[]`, `0` failed inside torch's DataLoader."""
    from transformers import pipeline

    match = rf"`{name}` must be an integer >= {1 if name == 'batch_size' else 0}, got {value}"
    with pytest.raises(ValueError, match=match):
        if given_to == "call":
            plain_translator(["A dog runs.", "A cat sleeps."], **{name: value})
        else:
            pipeline("translation", model=str(plain_folder[0]), device="cpu", **{name: value})(["A dog runs."])


@pytest.mark.parametrize("option", ["--batch-size", "--num-beams", "--max-length", "--max-new-tokens",
                                    "--max-source-length"])
@pytest.mark.parametrize("value", ["-1", "0"])
def test_bad_translate_script_counts(plain_folder, capsys, option, value):
    """`--batch-size -1` exited 0 writing nothing, `--batch-size 0` and `--num-beams 0` failed deep inside."""
    import re

    with pytest.raises(SystemExit) as exit_info:
        run_translate_script([str(plain_folder[0]), option, value])
    assert exit_info.value.code == 2
    assert re.search(rf"argument {option}: {value} is not a positive integer", capsys.readouterr().err)


def test_translate_script_gives_one_line_per_input_line(plain_folder, plain_translator, tmp_path):
    """A lone `\\r` (or U+2028) inside a line split it in two; a `\\r\\n` ending is one line break."""
    lines = ["A dog runs.\rA cat sleeps.", "Two men talk.\u2028Outside.", "A girl sings."]
    (tmp_path / "src.en").write_bytes(f"{lines[0]}\r\n{lines[1]}\n{lines[2]}".encode())
    run_translate_script([str(plain_folder[0]), "--input", str(tmp_path / "src.en"),
                          "--output", str(tmp_path / "hyp.de"), "--batch-size", "2"])
    written = (tmp_path / "hyp.de").read_text(encoding="utf-8").split("\n")
    assert written == [row["translation_text"] for row in plain_translator(lines)] + [""]


def test_translate_script_over_long_line(plain_folder, plain_translator, tmp_path):
    """An over-long line stopped the file deep inside the model; now its error names the file, the line and the
    options that cut it, and `--truncation` cuts it to the model's positions."""
    long_line = " ".join(["a dog runs in the park ."] * 8)
    (tmp_path / "src.en").write_text(f"A dog runs.\n{long_line}\nA girl sings.\n", encoding="utf-8")
    argv = [str(plain_folder[0]), "--input", str(tmp_path / "src.en"), "--output", str(tmp_path / "hyp.de")]
    with pytest.raises(SystemExit, match=rf"src.en, line 2: \d+ tokens, more than the model's {POSITIONS} positions: "
                                         rf"pass --truncation or --max-source-length {POSITIONS}"):
        run_translate_script(argv)
    run_translate_script([*argv, "--truncation"])
    expected = plain_translator(["A dog runs.", long_line, "A girl sings."], max_source_length=POSITIONS)
    assert (tmp_path / "hyp.de").read_text(encoding="utf-8").splitlines() == [row["translation_text"]
                                                                              for row in expected]


def test_pipeline_over_long_source(plain_translator):
    """`truncation=True` cut at the tokenizer's `model_max_length` (512), past the model's 32 positions, and the
    sentence failed inside the model; now it cuts at the positions, and without it the error names both options."""
    from mgsa_hf.pipeline_translation import SourceTooLongError

    long_line = " ".join(["a dog runs in the park ."] * 8)
    assert plain_translator.tokenizer.model_max_length > POSITIONS
    with pytest.raises(SourceTooLongError, match=rf"pass `truncation=True` or `max_source_length={POSITIONS}`"):
        plain_translator(long_line)
    assert plain_translator(long_line, truncation=True) == plain_translator(long_line, max_source_length=POSITIONS)


def wrong_head(batch):
    batch["head_word_ids"][0, 1] = 99


def negative_head(batch):
    batch["head_word_ids"][0, 1] = -5


def phrase_end_past_the_sentence(batch):
    last = int(batch["attention_mask"][1].sum()) - 1  # the shorter sentence's EOS
    batch["local_phrase_end"][1, last] = batch["input_ids"].shape[1] + 3


def phrase_start_after_its_token(batch):
    batch["local_phrase_start"][0, 0] = 2


def negative_depth(batch):
    batch["tree_depth"][0, 2] = -1


@pytest.mark.parametrize("backbone", ["marian", "t5"])
@pytest.mark.parametrize(("corrupt", "field"), [
    (wrong_head, "head_word_ids"), (negative_head, "head_word_ids"),
    (phrase_end_past_the_sentence, "local_phrase_end"), (phrase_start_after_its_token, "local_phrase_start"),
    (negative_depth, "tree_depth"),
])
def test_rhe_syntax_fields_out_of_range(multi30k_processor, tiny_config, tiny_t5_config, backbone, corrupt, field):
    """RHE read a head past the sentence, or a local phrase past its end, and its logits moved silently (MG-SA and
    PR refuse phrase ids past the sequence)."""
    from mgsa_hf import MgsaT5ForConditionalGeneration

    if backbone == "marian":
        model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "rhe", encoder_layers=1, rhe_layers=[0]))
    else:
        model = MgsaT5ForConditionalGeneration(tiny_t5_config(multi30k_processor, "rhe", rhe_layers=[0]))
    batch = multi30k_processor(["Two young men play football in a park.", "A dog runs."],
                               text_target=["Zwei Männer spielen.", "Ein Hund rennt."], return_tensors="pt")
    with torch.no_grad():
        model.eval()(**batch)  # the processor's fields pass
        corrupt(batch)
        with pytest.raises(ValueError, match=rf"`{field}` holds a value the processor never makes"):
            model(**batch)


def flip_a_weight_byte(path):
    """Flip one byte in the data part of a safetensors file (past its JSON header)."""
    import struct

    data = bytearray(path.read_bytes())
    header_size = struct.unpack("<Q", data[:8])[0]
    data[8 + header_size + (len(data) - 8 - header_size) // 2] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("backbone", ["marian", "t5"])
@pytest.mark.parametrize("sharded", [False, True])
def test_damaged_weights_are_refused(multi30k_processor, tiny_config, tiny_t5_config, tmp_path, backbone, sharded):
    """A flipped byte in a weight loaded without error (wrong losses, or NaN): the folder records the SHA-256 of its
    weights and loading checks it; a folder without the record loads as before."""
    import hashlib
    import re

    from mgsa_hf import MgsaT5ForConditionalGeneration
    from mgsa_hf.evaluation import average_checkpoints

    if backbone == "marian":
        model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1))
    else:
        model = MgsaT5ForConditionalGeneration(tiny_t5_config(multi30k_processor, "transformer"))
    model.save_pretrained(tmp_path, **({"max_shard_size": "40KB"} if sharded else {}))
    weights = sorted(tmp_path.glob("model*.safetensors"))
    assert len(weights) > 1 if sharded else [path.name for path in weights] == ["model.safetensors"]
    record = (tmp_path / "weights.sha256").read_text().splitlines()
    for path in weights:  # `sha256sum`'s format
        assert f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}" in record
    type(model).from_pretrained(tmp_path)

    flip_a_weight_byte(weights[-1])
    with pytest.raises(ValueError, match=rf"{re.escape(str(weights[-1]))} does not hold the weights that were saved"):
        type(model).from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="does not hold the weights that were saved"):
        average_checkpoints([tmp_path, tmp_path])  # `average_last_checkpoints` reads the checkpoints' files itself
    (tmp_path / "weights.sha256").unlink()
    type(model).from_pretrained(tmp_path)  # no record: loaded as before


def test_every_save_records_its_weights(multi30k_processor, tiny_config, tmp_path, monkeypatch):
    """`Trainer.save_model`, a Trainer checkpoint and `push_to_hub` (through `save_pretrained(push_to_hub=True)` too)
    write the record beside the weights, and the pipeline refuses a damaged folder."""
    import hashlib

    from huggingface_hub import CommitInfo, HfApi, RepoUrl
    from huggingface_hub.errors import EntryNotFoundError
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, pipeline

    from mgsa_hf import MgsaDataCollator

    uploads = {}

    def create_commit(self, repo_id, operations, *, commit_message, **_):
        for operation in operations:
            with operation.as_file() as handle:
                uploads[(repo_id, operation.path_in_repo)] = handle.read()
        return CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/{0:040x}",
                          commit_message=commit_message, commit_description="", oid=f"{0:040x}")

    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **_: RepoUrl(f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(HfApi, "create_commit", create_commit)

    def no_card(repo_id, filename, **_):
        raise EntryNotFoundError(f"{filename} not found in {repo_id}")

    monkeypatch.setattr("huggingface_hub.repocard.hf_hub_download", no_card)
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1))
    model.push_to_hub("someone/pushed")
    model.save_pretrained(tmp_path / "saved", push_to_hub=True, repo_id="someone/saved")
    for repo_id in ("someone/pushed", "someone/saved"):
        digest = hashlib.sha256(uploads[(repo_id, "model.safetensors")]).hexdigest()
        assert uploads[(repo_id, "weights.sha256")].decode() == f"{digest}  model.safetensors\n"

    plain = MgsaProcessor(multi30k_processor.tokenizer, with_syntax=False)
    encoded = plain(["A dog runs.", "A cat sleeps."], text_target=["Ein Hund rennt.", "Eine Katze schläft."])
    pairs = [{name: values[i] for name, values in encoded.items()} for i in range(2)]
    arguments = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], use_cpu=True, max_steps=1,
                                         save_steps=1, per_device_train_batch_size=2)
    trainer = Seq2SeqTrainer(model=model, args=arguments, train_dataset=pairs, processing_class=plain,
                             data_collator=MgsaDataCollator(tokenizer=plain.tokenizer))
    trainer.train()
    trainer.save_model(tmp_path / "trained")
    for folder in (tmp_path / "saved", tmp_path / "trained", tmp_path / "run" / "checkpoint-1"):
        digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
        assert (folder / "weights.sha256").read_text() == f"{digest}  model.safetensors\n"

    flip_a_weight_byte(tmp_path / "trained" / "model.safetensors")
    with pytest.raises(ValueError, match="model.safetensors does not hold the weights that were saved"):
        pipeline("translation", model=str(tmp_path / "trained"), device="cpu")

# --- training runs: resume, checkpoints, CLI paths ---
# `mgsa-hf train`'s run folder (resuming, torn checkpoints, its tokenizer), its settings, and the scripts' paths.


TINY_TRAIN_CONFIG = REPO / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"


def tiny_run_config(output_dir, *overrides):
    """The tiny recipe without evaluation, a checkpoint every step."""
    from mgsa_hf.training.config import load_train_config

    return load_train_config(TINY_TRAIN_CONFIG, [
        f"data={MULTI30K_DIR}", f"output_dir={output_dir}",
        "training.eval_strategy=no", "training.save_steps=1", "training.logging_steps=2", *overrides])


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory, one_thread):
    """A tiny run of 2 steps with checkpoint-1 and checkpoint-2: (results, model folder)."""
    from mgsa_hf.training.run import train

    folder = tmp_path_factory.mktemp("two_steps") / "model"
    results, _ = train(tiny_run_config(folder, "training.max_steps=2"))
    return results, folder


@pytest.fixture
def copied_run(two_step_run, tmp_path):
    """A copy of the two-step run's model and run folders: (results, model folder, checkpoints folder)."""
    from mgsa_hf.training.ownership import run_folder

    results, folder = two_step_run
    shutil.copytree(folder, tmp_path / "model")
    shutil.copytree(run_folder(folder), run_folder(tmp_path / "model"))
    return results, tmp_path / "model", run_folder(tmp_path / "model") / "checkpoints"


@pytest.mark.parametrize("run_folder_state", ["absent", "without checkpoints"])
def test_resume_true_without_a_checkpoint(tmp_path, run_folder_state):
    """`resume_from_checkpoint=true` (the CLI path) with no checkpoint to resume: an error naming the folder, before
    any work, not a run from scratch."""
    from mgsa_hf.training.ownership import run_folder
    from mgsa_hf.training.run import run_train

    checkpoints = run_folder(tmp_path / "model") / "checkpoints"
    if run_folder_state == "without checkpoints":
        checkpoints.mkdir(parents=True)
    overrides = [f"data={MULTI30K_DIR}", f"output_dir={tmp_path / 'model'}",
                 "training.max_steps=1", "resume_from_checkpoint=true"]
    with pytest.raises(FileNotFoundError, match=rf"resume_from_checkpoint=true: .*no checkpoint.* in {checkpoints}"):
        run_train(argparse.Namespace(config=str(TINY_TRAIN_CONFIG), overrides=overrides))
    assert not (run_folder(tmp_path / "model") / "tokenizer").exists()


@pytest.mark.parametrize("removed", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_resume_from_a_torn_checkpoint(copied_run, removed):
    """A checkpoint that lacks its optimizer, schedule or random state, given as the one to resume: an error naming
    the missing file (the Trainer would go on with a fresh one)."""
    from mgsa_hf.training.run import train

    _, folder, checkpoints = copied_run
    (checkpoints / "checkpoint-2" / removed).unlink()
    with pytest.raises(ValueError, match=rf"resume_from_checkpoint='.*checkpoint-2' lacks {re.escape(removed)}"):
        train(tiny_run_config(folder, "training.max_steps=2",
                              f"resume_from_checkpoint={checkpoints / 'checkpoint-2'}"))


def test_resume_true_skips_a_torn_last_checkpoint(copied_run, caplog):
    """`resume_from_checkpoint=true` with the last checkpoint torn: resumes from the newest complete one, warning
    which it skipped and why, and trains the steps after it."""
    from mgsa_hf.training.run import train

    _, folder, checkpoints = copied_run
    (checkpoints / "checkpoint-2" / "optimizer.pt").unlink()
    with caplog.at_level(logging.WARNING, logger="mgsa_hf"):
        results, _ = train(tiny_run_config(folder, "training.max_steps=2", "resume_from_checkpoint=true"))
    assert re.search(r"resuming from .*checkpoint-1.*skipped.*checkpoint-2 lacks optimizer\.pt", caplog.text)
    assert results["global_step"] == 2 and (checkpoints / "checkpoint-2" / "optimizer.pt").is_file()


def test_resumed_run_reports_the_whole_runs_train_loss(two_step_run, copied_run):
    """Resumed after step 1, the run's `train_loss` (results.json) is the mean over both steps, as the uninterrupted
    run's, not the mean of the steps after the resume."""
    from mgsa_hf.training.ownership import run_folder
    from mgsa_hf.training.run import train

    uninterrupted, folder, checkpoints = copied_run
    shutil.rmtree(checkpoints / "checkpoint-2")
    results, _ = train(tiny_run_config(folder, "training.max_steps=2", "resume_from_checkpoint=true"))
    assert results["global_step"] == 2
    assert results["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-5)
    saved = json.loads((run_folder(folder) / "results.json").read_text())
    assert saved["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-5)


@pytest.mark.parametrize("value", ["-1", "1.5", "true", "all"])
def test_bad_average_last_checkpoints(tmp_path, value):
    from mgsa_hf.training.ownership import run_folder
    from mgsa_hf.training.run import train

    with pytest.raises(ValueError, match=r"`average_last_checkpoints` must be a whole number >= 0.*got"):
        train(tiny_run_config(tmp_path / "model", "training.max_steps=1", f"average_last_checkpoints={value}"))
    assert not run_folder(tmp_path / "model").exists()


def test_rerun_with_another_vocab_size(copied_run):
    """A second run in the same `output_dir` with another `vocab_size`: resuming stops, naming the change (the
    checkpoints embed the earlier vocabulary); starting again (over the earlier run) trains the vocabulary again
    instead of reusing it."""
    from transformers import AutoTokenizer

    from mgsa_hf.training.ownership import run_folder
    from mgsa_hf.training.run import train

    _, folder, _ = copied_run
    earlier = len(AutoTokenizer.from_pretrained(run_folder(folder) / "tokenizer"))
    with pytest.raises(ValueError, match=r"tokenizer in .* other settings \(vocab_size=300 → 120\).*resume"):
        train(tiny_run_config(folder, "training.max_steps=2", "vocab_size=120", "resume_from_checkpoint=true"))
    _, model = train(tiny_run_config(folder, "training.max_steps=1", "vocab_size=120", "overwrite_output_dir=true"))
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

    from mgsa_hf.training.ownership import run_folder
    from mgsa_hf.training.run import train

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(FileNotFoundError, match=rf"{key}='{re.escape(path)}': no such folder"):
        train(tiny_run_config(tmp_path / "model", f"{key}={path}"))
    assert not run_folder(tmp_path / "model").exists()

    def from_the_hub(name, *args, **kwargs):
        raise OSError(f"asked the Hub for {name}")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_the_hub)
    monkeypatch.setattr(transformers.PretrainedConfig, "get_config_dict",
                        classmethod(lambda cls, name, *args, **kwargs: from_the_hub(name)))
    with pytest.raises(ValueError, match="asked the Hub for someorg/some-model"):
        train(tiny_run_config(tmp_path / "model", f"{key}=someorg/some-model"))


@pytest.mark.parametrize("path", ["./no-such-model", "/no/such/model", "a/b/c"])
def test_convert_marian_with_a_missing_folder(tmp_path, path):
    from mgsa_hf.cli import main

    with pytest.raises(SystemExit, match=rf"marian='{re.escape(path)}': no such folder"):
        main(["convert", path, str(tmp_path / "out")])
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
    from mgsa_hf.training.ownership import run_folder
    from mgsa_hf.training.run import train

    with pytest.raises(ValueError, match=match):
        train(tiny_run_config(tmp_path / "model", f"training.{key}={value}"))
    assert not run_folder(tmp_path / "model").exists()


@pytest.mark.parametrize("arguments", [["--jobs", "0"], ["--jobs", "-2"], ["--threads", "0"]])
def test_bench_quality_needs_at_least_one_job(capsys, arguments):
    """`--jobs 0` would start no run and wait for one forever: argparse refuses it, naming the option."""
    from mgsa_hf.benchmarking.quality import parse_args

    with pytest.raises(SystemExit):
        parse_args(["train", "--budget", "dry-run", *arguments])
    assert f"argument {arguments[0]}:" in capsys.readouterr().err
