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
