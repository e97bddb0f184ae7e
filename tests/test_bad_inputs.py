"""Bad input gets a clear error naming the argument (or a documented sane result), never a crash deep inside torch or
spaCy: the processor, `syntax()`, and forward/generate of every encoder type."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration, MgsaProcessor, MgsaT5Config
from mgsa_hf.conversion import convert_checkpoint
from mgsa_hf.training import load_train_config, train


ENCODER_TYPES = ["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"]
REPO = Path(__file__).resolve().parents[1]


# --- configuration: every way a config is made ---
# `MgsaConfig(...)`, `from_pretrained(path, **kwargs)`, a hand-edited config.json, a config changed after construction,
# the CLI's `model.*` keys and `convert_marian.py --set` all reach one validation (`@strict` fields and `validate_*`).

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
    """The corpus does not exist: an error about it would mean the model section was checked after work began."""
    overrides = [override.format(model=saved_tiny_model) for override in overrides]
    config = load_train_config(None, [f"data={tmp_path / 'no-corpus'}", f"output_dir={tmp_path / 'run'}", *overrides])
    with pytest.raises(error, match=f"(?s){match}"):
        train(config)


@pytest.mark.parametrize(("arguments", "message"), [
    (["--encoder-type", "bogus"], "invalid choice: 'bogus'"),
    (["--set", "rhe_layers=[0,"], "must be JSON"),
    (["--set", "rhe_layers"], "expected FIELD=JSON"),
])
def test_convert_marian_arguments(saved_tiny_model, tmp_path, capsys, arguments, message):
    spec = importlib.util.spec_from_file_location("convert_marian", REPO / "scripts" / "convert_marian.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit):
        script.parse_args([str(saved_tiny_model), str(tmp_path / "out"), *arguments])
    assert message in capsys.readouterr().err


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
        assert encoder_type in ("phrase_memory", "hybrid"), error
        assert "runs with attn_implementation in ['eager', 'sdpa']" in str(error)
    else:
        assert encoder_type not in ("phrase_memory", "hybrid")
        torch.testing.assert_close(flex, losses["sdpa"], atol=1e-4, rtol=1e-4)
