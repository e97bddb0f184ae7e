"""Bad input gets a clear error naming the argument (or a documented sane result), never a crash deep inside torch or
spaCy: the processor, `syntax()`, and forward/generate of every encoder type."""

import pytest
import torch

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration, MgsaProcessor


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
def test_over_long_text_without_truncation(multi30k_processor, encoder_type):
    """A 1000-word sentence: truncated with its syntax fields when `truncation=True`; without truncation the model
    raises a clear error naming `truncation=True` and its limit."""
    tokenizer = multi30k_processor.tokenizer
    config = MgsaConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, decoder_start_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=128, encoder_type=encoder_type, num_phrase_tags=len(multi30k_processor.phrase_tags),
        phrase_memory_layers=[0], hybrid_layers=[0], rhe_layers=[0],
    )
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
