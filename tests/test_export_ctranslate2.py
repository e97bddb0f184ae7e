"""CTranslate2 export of the plain Transformer (`mgsa_hf.export.export_ctranslate2`): on a trained model CTranslate2's
greedy and beam-4 outputs are Transformers' `generate` outputs, token for token; the vocabulary keeps the tokenizer's
layout (`<pad>` at id 2, where CTranslate2's own Marian converter expects it last); the script converts a saved folder
and `translate_ctranslate2` translates text; the variants and the T5 backbone are refused with a message naming
ONNX."""

import json
from pathlib import Path

import pytest
import torch

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration, MgsaT5Config, MgsaT5ForConditionalGeneration
from mgsa_hf.export import export_ctranslate2, translate_ctranslate2


ctranslate2 = pytest.importorskip("ctranslate2")

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
MAX_NEW_TOKENS = 16


def reversal_batch(size: int, generator: torch.Generator, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """`size` sources of 3-10 content tokens + EOS, right-padded, and their targets: the tokens reversed + EOS
    (labels, -100 on padding)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    lengths = torch.randint(3, 11, (size,), generator=generator).tolist()
    sources = torch.full((size, 11), pad)
    labels = torch.full((size, 11), -100)
    for row, length in enumerate(lengths):
        tokens = torch.randint(3, 60, (length,), generator=generator)
        sources[row, : length + 1] = torch.cat([tokens, torch.tensor([eos])])
        labels[row, : length + 1] = torch.cat([tokens.flip(0), torch.tensor([eos])])
    return sources, labels


@pytest.fixture(scope="module")
def trained(tmp_path_factory, multi30k_processor):
    """A 64-wide plain Transformer (tied embeddings, `<pad>` = decoder start at id 2) trained for 300 steps to reverse
    token sequences, a task it learns in seconds (about 60 of 64 new sequences right) and that reads the source;
    saved with its tokenizer."""
    tokenizer = multi30k_processor.tokenizer
    config = MgsaConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id, forced_eos_token_id=tokenizer.eos_token_id, d_model=64,
        encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64, dropout=0.0, scale_embedding=True,
        init_std=0.1,
    )
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 50))
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        sources, labels = reversal_batch(32, generator, tokenizer)
        loss = model(input_ids=sources, attention_mask=sources.ne(config.pad_token_id), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        warmup.step()
    model.eval()
    folder = tmp_path_factory.mktemp("trained")
    model.save_pretrained(folder)
    multi30k_processor.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def converted(trained, tmp_path_factory):
    return export_ctranslate2(trained[1], tmp_path_factory.mktemp("ct2") / "model", force=True)


def without_specials(ids: list[int], tokenizer) -> list[int]:
    return [i for i in ids if i not in (tokenizer.pad_token_id, tokenizer.eos_token_id, -100)]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_ctranslate2_outputs_equal_generate(trained, converted, multi30k_processor, num_beams):
    model, _ = trained
    tokenizer = multi30k_processor.tokenizer
    pad = tokenizer.pad_token_id
    # the decoder starts from the `<pad>` embedding, which training moved away from zero (tied with the LM head):
    # CTranslate2's Marian converter would start from a zero vector instead
    assert model.model.shared.weight[pad].norm() > 0.1
    sources, labels = reversal_batch(64, torch.Generator().manual_seed(1), tokenizer)
    with torch.no_grad():
        generated = model.generate(input_ids=sources, attention_mask=sources.ne(pad), num_beams=num_beams,
                                   max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    expected = [tokenizer.convert_ids_to_tokens(without_specials(row, tokenizer)) for row in generated.tolist()]
    translator = ctranslate2.Translator(str(converted), device="cpu", intra_threads=1)
    source_tokens = [tokenizer.convert_ids_to_tokens([i for i in row if i != pad]) for row in sources.tolist()]
    # Transformers forces EOS as the last of `max_new_tokens`: CTranslate2 stops one token earlier
    results = translator.translate_batch(source_tokens, beam_size=num_beams, max_decoding_length=MAX_NEW_TOKENS - 1)
    actual = [result.hypotheses[0] for result in results]
    assert actual == expected
    # not vacuous: the model reads its source (the outputs differ, and many are the reversed source)
    references = [tokenizer.convert_ids_to_tokens(without_specials(row, tokenizer)) for row in labels.tolist()]
    assert len({tuple(tokens) for tokens in expected}) == len(expected)
    assert sum(a == b for a, b in zip(expected, references, strict=True)) >= len(expected) * 3 // 4


def test_vocabulary_keeps_the_tokenizer_layout(converted, multi30k_processor):
    tokenizer = multi30k_processor.tokenizer
    vocabulary = json.loads((converted / "shared_vocabulary.json").read_text())
    assert vocabulary == tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    assert vocabulary[tokenizer.pad_token_id] == "<pad>" and tokenizer.pad_token_id == 2
    config = json.loads((converted / "config.json").read_text())
    assert config["decoder_start_token"] == "<pad>" and config["eos_token"] == "</s>"


def test_script_and_text_translation(trained, multi30k_processor, multi30k_val, tmp_path, capsys):
    """`mgsa-hf export ct2 FOLDER OUTPUT` converts; `translate_ctranslate2` translates text as the
    model's greedy `generate` does."""
    model, folder = trained
    from mgsa_hf.cli import main

    main(["export", "ct2", str(folder), str(tmp_path / "ct2")])
    report = json.loads(capsys.readouterr().out)
    assert report["output_dir"] == str(tmp_path / "ct2") and (tmp_path / "ct2" / "model.bin").is_file()

    tokenizer = multi30k_processor.tokenizer
    sources = multi30k_val[0][:8]
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    actual = translate_ctranslate2(translator, tokenizer, sources, max_length=32, beam_size=1,
                                   max_decoding_length=MAX_NEW_TOKENS - 1)
    batch = tokenizer(sources, return_tensors="pt", padding=True, truncation=True, max_length=32)
    with torch.no_grad():
        generated = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    assert actual == tokenizer.batch_decode(generated, skip_special_tokens=True)
    assert len(set(actual)) > 1


@pytest.mark.parametrize("encoder_type", ["phrase_memory", "rhe"])
def test_variants_are_refused_naming_onnx(encoder_type, multi30k_processor, tiny_config, tmp_path):
    MgsaForConditionalGeneration(tiny_config(multi30k_processor, encoder_type)).save_pretrained(tmp_path / "model")
    refusal = rf'encoder_type="{encoder_type}".*export this model to ONNX \(`mgsa-hf export onnx`'
    with pytest.raises(ValueError, match=refusal):
        export_ctranslate2(tmp_path / "model", tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


def test_t5_backbone_is_refused(multi30k_processor, tmp_path):
    tokenizer = multi30k_processor.tokenizer
    config = MgsaT5Config(vocab_size=len(tokenizer), d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                          decoder_start_token_id=tokenizer.pad_token_id)
    MgsaT5ForConditionalGeneration(config).save_pretrained(tmp_path / "model")
    with pytest.raises(ValueError, match="'mgsa_t5' model.*export other models to ONNX"):
        export_ctranslate2(tmp_path / "model", tmp_path / "ct2")
