"""The plain (`encoder_type="transformer"`) model against transformers' own MarianMTModel, save/load round trips,
remote-code loading and config validation."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import tiny_sizes
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel

import mgsa_hf
from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration


PAD = 49
# Marian's own dropout (0.1; attention dropout 0.0)
TINY = tiny_sizes(vocab_size=50, decoder_layers=2, max_position_embeddings=64, pad_token_id=PAD,
                  decoder_start_token_id=PAD, eos_token_id=0, forced_eos_token_id=0, dropout=0.1)


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    torch.manual_seed(0)
    marian = MarianMTModel(MarianConfig(**TINY)).eval()
    torch.nn.init.normal_(marian.final_logits_bias, std=0.05)
    folder = tmp_path_factory.mktemp("marian")
    marian.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def batch():
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 0], [10, 11, 12, 0, PAD, PAD], [13, 0, PAD, PAD, PAD, PAD]])
    decoder_input_ids = torch.tensor([[PAD, 3, 4, 5], [PAD, 6, 7, PAD], [PAD, 8, PAD, PAD]])
    return {
        "input_ids": input_ids,
        "attention_mask": input_ids.ne(PAD).long(),
        "decoder_input_ids": decoder_input_ids,
        "decoder_attention_mask": decoder_input_ids.ne(PAD).long().index_fill(1, torch.tensor([0]), 1),
    }


def test_logits_match_marian(marian_dir, batch):
    marian = MarianMTModel.from_pretrained(marian_dir).eval()
    ours = MgsaForConditionalGeneration.from_pretrained(marian_dir, encoder_type="transformer").eval()
    assert isinstance(ours.config, MgsaConfig)
    with torch.no_grad():
        expected = marian(**batch).logits
        actual = ours(**batch).logits
    assert (expected - actual).abs().max().item() <= 1e-5
    # the comparison is not vacuous: logits vary over positions and vocabulary
    assert expected.std() > 0.1


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_matches_marian(marian_dir, batch, num_beams):
    marian = MarianMTModel.from_pretrained(marian_dir).eval()
    ours = MgsaForConditionalGeneration.from_pretrained(marian_dir).eval()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    kwargs = dict(num_beams=num_beams, max_new_tokens=12, do_sample=False)
    expected = marian.generate(**inputs, **kwargs)
    actual = ours.generate(**inputs, **kwargs)
    assert torch.equal(expected, actual)
    # not vacuous: different sources get different outputs
    assert len({tuple(row) for row in expected.tolist()}) > 1


def test_labels_loss_matches_marian(marian_dir, batch):
    marian = MarianMTModel.from_pretrained(marian_dir).eval()
    ours = MgsaForConditionalGeneration.from_pretrained(marian_dir).eval()
    labels = torch.tensor([[3, 4, 5, 0], [6, 7, 0, -100], [8, 0, -100, -100]])
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": labels}
    with torch.no_grad():
        expected, actual = marian(**inputs).loss, ours(**inputs)
    assert torch.allclose(expected, actual.loss, atol=1e-6)
    assert actual.tag_loss is None and torch.equal(actual.translation_loss, actual.loss)


def test_save_load_round_trip(tmp_path, marian_dir, batch):
    model = MgsaForConditionalGeneration.from_pretrained(marian_dir).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "mgsa"
    assert saved["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_mgsa.MgsaForConditionalGeneration"
    assert saved["auto_map"]["AutoModel"] == "modeling_mgsa.MgsaModel"
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is MgsaForConditionalGeneration
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, reloaded(**batch).logits)


def test_remote_code_loads_without_the_package(tmp_path, marian_dir, batch):
    """A saved folder carries its code: a fresh process where `mgsa_hf` cannot be imported loads it."""
    model = MgsaForConditionalGeneration.from_pretrained(marian_dir).eval()
    model.save_pretrained(tmp_path / "model")
    for code_file in ("configuration_mgsa.py", "modeling_mgsa.py", "modeling_common.py", "modeling_attention.py",
                      "modeling_variant.py", "modeling_syntax_inputs.py", "modeling_outputs_mgsa.py",
                      "modeling_loss.py", "modeling_upgrade.py", "variants.py", "variant_rhe.py", "syntax_fields.py"):
        assert (tmp_path / "model" / code_file).exists()
    torch.save(batch, tmp_path / "batch.pt")
    with torch.no_grad():
        torch.save(model(**batch).logits, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["mgsa_hf"] = None  # any import of the package fails
        import torch
        from transformers import AutoModel, AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained(r"{tmp_path / 'model'}", trust_remote_code=True).eval()
        assert not type(model).__module__.startswith("mgsa_hf"), type(model).__module__
        batch = torch.load(r"{tmp_path / 'batch.pt'}")
        with torch.no_grad():
            logits = model(**batch).logits
        expected = torch.load(r"{tmp_path / 'expected.pt'}")
        assert torch.equal(logits, expected), (logits - expected).abs().max()
        # the bare encoder-decoder through AutoModel: the same decoder states that feed the LM head
        base = AutoModel.from_pretrained(r"{tmp_path / 'model'}", trust_remote_code=True).eval()
        assert type(base).__name__ == "MgsaModel" and not type(base).__module__.startswith("mgsa_hf")
        with torch.no_grad():
            states = base(**batch)
            torch.testing.assert_close(model.lm_head(states.last_hidden_state) + model.final_logits_bias, expected)
        print("REMOTE_OK", type(model).__module__)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "REMOTE_OK" in result.stdout


def test_variant_modules_are_new_and_reported(marian_dir, caplog):
    """Loading a Marian checkpoint into a variant initialises exactly the variant's modules."""
    config = MgsaConfig.from_pretrained(marian_dir, encoder_type="hybrid")
    try:
        model, info = MgsaForConditionalGeneration.from_pretrained(
            marian_dir, config=config, output_loading_info=True
        )
    except NotImplementedError:
        pytest.skip("hybrid encoder not available")
    marian_keys = set(MarianMTModel.from_pretrained(marian_dir).state_dict())
    new_keys = set(model.state_dict()) - marian_keys
    assert new_keys, "the variant adds parameters"
    assert set(info["missing_keys"]) == new_keys
    assert not info["unexpected_keys"]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"encoder_type": "lstm"}, "encoder_type"),
        ({"phrase_composition": "sum"}, "phrase_composition"),
        ({"d_model": 30}, "encoder_attention_heads"),
        ({"encoder_type": "hybrid", "hybrid_layers": [5]}, "hybrid_layers"),
        ({"encoder_type": "rhe", "rhe_layers": []}, "rhe_layers"),
        ({"phrase_word_heads": 1, "phrase_heads_per_granularity": [1, 1, 0]}, "phrase_heads_per_granularity"),
        ({"phrase_word_heads": 4}, "phrase_word_heads"),
        ({"rhe_max_relative_position": -1}, "rhe_max_relative_position"),
        ({"pr_min_phrase_tokens": 9}, "pr_min_phrase_tokens"),
        ({"rhe_fixed_gate": 1.5}, "rhe_fixed_gate"),
        ({"hybrid_window": 0}, "hybrid_window"),
    ],
)
def test_invalid_config_values(kwargs, field):
    with pytest.raises(StrictDataclassError, match=field):
        MgsaConfig(**{**TINY, **kwargs})


def test_config_round_trip_and_auto_config(tmp_path):
    config = MgsaConfig(**TINY, encoder_type="rhe", rhe_max_relative_position=4)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, MgsaConfig)
    assert (loaded.encoder_type, loaded.rhe_max_relative_position, loaded.rhe_layers) == ("rhe", 4, [0])


def test_marian_config_reads_as_mgsa(marian_dir):
    config = MgsaConfig.from_pretrained(marian_dir, encoder_type="rhe")
    assert config.model_type == "mgsa" and config.encoder_type == "rhe" and config.d_model == TINY["d_model"]


def test_package_registers_auto_classes():
    assert AutoConfig.for_model("mgsa").__class__ is MgsaConfig
    model = AutoModelForSeq2SeqLM.from_config(MgsaConfig(**TINY))
    assert isinstance(model, mgsa_hf.MgsaForConditionalGeneration)


def test_convert_marian_script(tmp_path, marian_dir, batch):
    """`mgsa-hf convert` keeps every Marian weight and reports the variant's new modules."""
    result = subprocess.run(
        [sys.executable, "-m", "mgsa_hf.cli", "convert", str(marian_dir), str(tmp_path / "out"),
         "--encoder-type", "rhe", "--set", "rhe_mode=\"sea_all\""],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["new_modules"] and all(".layers.0.self_attn." in name for name in report["new_modules"])
    converted = MgsaForConditionalGeneration.from_pretrained(tmp_path / "out")
    assert (converted.config.encoder_type, converted.config.rhe_mode) == ("rhe", "sea_all")
    marian = MarianMTModel.from_pretrained(marian_dir)
    converted_state = converted.state_dict()
    for name, tensor in marian.state_dict().items():
        assert torch.equal(converted_state[name], tensor), name


@pytest.mark.parametrize("beside_the_model", ["tokenizer", "processor"])
def test_plain_marian_pipeline_after_import(marian_processor, tmp_path, beside_the_model):
    """Importing the package registers `translation`; a plain MarianMTModel folder with only its tokenizer still
    translates through it (the processor is optional), with the same tokens as `generate`. With a syntax processor
    saved beside it, the pipeline parses nothing: the plain model reads no syntax fields."""
    from transformers import pipeline

    tokenizer = marian_processor.tokenizer
    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, pad_token_id=tokenizer.pad_token_id,
        decoder_start_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        max_position_embeddings=64)).eval()
    model.save_pretrained(tmp_path)
    (tokenizer if beside_the_model == "tokenizer" else marian_processor).save_pretrained(tmp_path)
    translator = pipeline("translation", model=str(tmp_path), device="cpu")
    if beside_the_model == "processor":
        assert translator.processor is not None and marian_processor.with_syntax
    assert not getattr(translator.processor, "with_syntax", False)  # it parses nothing
    sources = ["A man rides a bike.", "Two dogs play in the snow."]
    with torch.no_grad():
        expected = model.generate(**tokenizer(sources, return_tensors="pt", padding=True), num_beams=2,
                                  max_new_tokens=6)
    texts = [t.strip() for t in tokenizer.batch_decode(expected, skip_special_tokens=True)]
    assert [row["translation_text"] for row in translator(sources, num_beams=2, max_new_tokens=6)] == texts


@pytest.mark.parametrize("pad_to_multiple_of", [None, 16])
def test_resize_token_embeddings_then_forward_generate_save_load(tmp_path, marian_dir, batch, pad_to_multiple_of):
    """New tokens (a tokenizer grown by 8) resize embeddings, LM head and `final_logits_bias` together; old tokens'
    logits are unchanged and the resized model generates, saves and reloads."""
    model = MgsaForConditionalGeneration.from_pretrained(marian_dir).eval()
    with torch.no_grad():
        before = model(**batch).logits
    old_size = model.config.vocab_size
    model.resize_token_embeddings(old_size + 8, pad_to_multiple_of=pad_to_multiple_of)
    new_size = model.get_input_embeddings().weight.shape[0]
    assert new_size >= old_size + 8 and model.final_logits_bias.shape == (1, new_size)
    assert model.config.vocab_size == new_size
    with torch.no_grad():
        after = model(**batch).logits
    assert after.shape[-1] == new_size
    torch.testing.assert_close(after[..., :old_size], before)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    generated = model.generate(**inputs, num_beams=2, max_new_tokens=5)
    model.save_pretrained(tmp_path)
    reloaded = MgsaForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert torch.equal(reloaded.generate(**inputs, num_beams=2, max_new_tokens=5), generated)


def test_over_long_sequences_raise_a_clear_error(marian_dir):
    """A source longer than `max_position_embeddings` (a long text tokenized without truncation) and a generation
    past it raise a `ValueError` naming the limit and the remedy, not an index error inside the embedding."""
    model = MgsaForConditionalGeneration.from_pretrained(marian_dir).eval()
    limit = model.config.max_position_embeddings
    long_ids = torch.full((1, limit + 1), 5)
    long_ids[0, -1] = 0
    with pytest.raises(ValueError, match=rf"{limit + 1} tokens.*max_position_embeddings.*truncation=True"):
        model.generate(input_ids=long_ids, attention_mask=torch.ones_like(long_ids), max_new_tokens=2)
    short = long_ids[:, -4:]
    with pytest.raises(ValueError, match=r"target sequence .*max_new_tokens"):
        model.generate(input_ids=short, attention_mask=torch.ones_like(short), max_new_tokens=limit + 5,
                       min_new_tokens=limit + 5)
    model.generate(input_ids=long_ids[:, -limit:], attention_mask=torch.ones_like(long_ids[:, -limit:]),
                   max_new_tokens=2)


def test_checkpoint_averaging_reads_sharded_folders(tmp_path, marian_dir):
    """Averaging two checkpoints, one saved in shards: the element-wise mean of every weight."""
    from mgsa_hf.evaluation import average_checkpoints

    first = MgsaForConditionalGeneration.from_pretrained(marian_dir)
    second = MgsaForConditionalGeneration.from_pretrained(marian_dir)
    with torch.no_grad():
        for parameter in second.parameters():
            parameter.add_(1.0)
    first.save_pretrained(tmp_path / "a")
    second.save_pretrained(tmp_path / "b", max_shard_size="20KB")
    assert (tmp_path / "b" / "model.safetensors.index.json").is_file()
    averaged = average_checkpoints([tmp_path / "a", tmp_path / "b"])
    parameters = dict(first.named_parameters())
    compared = [name for name in averaged if name in parameters]
    assert len(compared) > 10
    for name in compared:
        torch.testing.assert_close(averaged[name], parameters[name].detach() + 0.5, msg=name)


def test_decoder_takes_the_cache_under_either_name(marian_dir, batch):
    """transformers >= 5.24 passes the decoder cache as `cache`, earlier versions as `past_key_values`: both names
    give the same cached step, and both at once are refused."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    model = MgsaForConditionalGeneration.from_pretrained(marian_dir).eval()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    start = torch.full((batch["input_ids"].shape[0], 1), model.config.decoder_start_token_id)
    second = batch["input_ids"][:, :1]
    steps = {}
    with torch.no_grad():
        for name in ("cache", "past_key_values"):
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            model(**inputs, decoder_input_ids=start, use_cache=True, **{name: cache})
            assert cache.get_seq_length() == 1  # the first step filled the cache it was given
            steps[name] = model(**inputs, decoder_input_ids=second, use_cache=True, **{name: cache}).logits
        torch.testing.assert_close(steps["cache"], steps["past_key_values"])
        full = model(**inputs, decoder_input_ids=torch.cat([start, second], 1)).logits[:, -1:]
        torch.testing.assert_close(steps["cache"], full, atol=1e-5, rtol=1e-4)
        with pytest.raises(ValueError, match="not both"):
            model(**inputs, decoder_input_ids=start, cache=DynamicCache(), past_key_values=DynamicCache())


@pytest.mark.parametrize("backbone", ["marian", "t5"])
def test_outputs_name_the_cache_as_the_installed_transformers_does(backbone, batch):
    """transformers 5.24 renamed the outputs' `past_key_values` to `cache` (the old name still works there but logs a
    deprecation warning): a cached forward and beam search fill the installed name and log no such warning."""
    from transformers.cache_utils import EncoderDecoderCache
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging as transformers_logging

    from mgsa_hf import MgsaT5Config, MgsaT5ForConditionalGeneration
    from mgsa_hf.modeling_outputs_mgsa import OUTPUT_CACHE_FIELD

    if backbone == "marian":
        model = MgsaForConditionalGeneration(MgsaConfig(**TINY, encoder_type="phrase_representation"))
    else:
        model = MgsaT5ForConditionalGeneration(MgsaT5Config(
            vocab_size=TINY["vocab_size"], d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, pad_token_id=PAD,
            eos_token_id=0, decoder_start_token_id=PAD, encoder_type="phrase_representation"))
    model.eval()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    transformers_logging.warning_once.cache_clear()  # a warning logged earlier in the session would log only once
    with CaptureLogger(transformers_logging.get_logger("transformers.utils.generic")) as captured, torch.no_grad():
        output = model(**inputs, decoder_input_ids=batch["decoder_input_ids"], use_cache=True)
        generated = model.generate(**inputs, num_beams=2, max_new_tokens=3, return_dict_in_generate=True)
    assert isinstance(getattr(output, OUTPUT_CACHE_FIELD), EncoderDecoderCache)
    assert isinstance(getattr(generated, OUTPUT_CACHE_FIELD), EncoderDecoderCache)
    assert "deprecated" not in captured.out
