"""The T5 backbone: a `T5ForConditionalGeneration` folder loads as `MgsaT5ForConditionalGeneration` and computes the
same thing; every encoder variant runs on it (real processor batches, padding invariance, beam search); the training
recipe trains the T5 family and the saved folder loads through the Auto classes, the pipeline and remote code."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_DIR
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForSeq2SeqLM, T5Config, T5ForConditionalGeneration, pipeline

from mgsa_hf import MgsaT5Config, MgsaT5ForConditionalGeneration
from mgsa_hf.training.conversion import load_as_mgsa
from mgsa_hf.training.ownership import run_folder


REPO = Path(__file__).resolve().parents[1]
DATA = MULTI30K_DIR
SOURCES = ["A man rides a bike down the street.", "Two dogs are playing in the snow."]
# T5 v1.0 (ReLU feed-forward, tied embeddings) and v1.1 (gated GELU, untied), with d_kv * heads != d_model
T5_VERSIONS = {
    "v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}
VARIANTS = {
    # the paper's final system (syntactic, tags, ON-LSTM), chunks of 2 for the 18-wide phrase memory
    "phrase_memory": {"encoder_type": "phrase_memory", "on_lstm_chunk_size": 2},
    "phrase_memory (n-gram, ON-LSTM)": {
        "encoder_type": "phrase_memory", "phrase_partition": "ngram", "phrase_tag_supervision": False,
        "on_lstm_chunk_size": 2,
    },
    "phrase_representation": {"encoder_type": "phrase_representation"},
    "phrase_representation (parse)": {"encoder_type": "phrase_representation", "pr_segmentation": "parse"},
    "hybrid": {"encoder_type": "hybrid"},
    # the default gate labels every head of an untrained model important (SEA unused, its parameters without a
    # gradient), so the RHE rows fix it at 1: every head redundant, the syntax-enhanced attention on each
    "rhe": {"encoder_type": "rhe", "rhe_fixed_gate": 1.0},
    "rhe (DEA)": {"encoder_type": "rhe", "rhe_attention": "dea", "rhe_fixed_gate": 1.0},
}


pytestmark = pytest.mark.usefixtures("one_thread")


def t5_config(vocab_size: int, pad_token_id: int, eos_token_id: int, version: str = "v1.1") -> T5Config:
    return T5Config(
        vocab_size=vocab_size, d_model=32, d_kv=6, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
        pad_token_id=pad_token_id, eos_token_id=eos_token_id, decoder_start_token_id=pad_token_id,
        **T5_VERSIONS[version],
    )


@pytest.fixture(scope="module", params=list(T5_VERSIONS))
def t5_dir(request, tmp_path_factory, multi30k_processor):
    """A randomly initialised T5 (each version) over the Multi30k tokenizer, saved to a folder."""
    tokenizer = multi30k_processor.tokenizer
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(t5_config(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id,
                                                 request.param))
    folder = tmp_path_factory.mktemp(f"t5-{request.param}")
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def real_batch(multi30k_processor, multi30k_val):
    """A padded batch of six Multi30k val pairs through the processor (parser included), and each source alone."""
    sources, targets = multi30k_val[0][:6], multi30k_val[1][:6]
    batch = dict(multi30k_processor(sources, text_target=targets, return_tensors="pt"))
    singles = [dict(multi30k_processor([source], return_tensors="pt")) for source in sources]
    assert batch["attention_mask"].eq(0).any()  # the batch is padded
    return batch, singles


def source_inputs(batch: dict) -> dict:
    return {key: value for key, value in batch.items() if key != "labels"}


def test_t5_checkpoint_computes_what_t5_computes(t5_dir, real_batch):
    reference = T5ForConditionalGeneration.from_pretrained(t5_dir).eval()
    model, info = MgsaT5ForConditionalGeneration.from_pretrained(t5_dir, output_loading_info=True)
    model.eval()
    assert not any(info.values()), info  # every T5 weight loads, nothing is new or left over
    batch, _ = real_batch
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "labels")}
    with torch.no_grad():
        expected, ours = reference(**inputs), model(**batch)
    assert (ours.logits - expected.logits).abs().max() <= 1e-5
    torch.testing.assert_close(ours.loss, expected.loss)
    model.set_attn_implementation("eager")  # the position bias goes through either kernel
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, expected.logits, atol=1e-4, rtol=1e-5)  # another kernel
    model.set_attn_implementation("sdpa")
    generate_inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
    for num_beams in (1, 4):
        settings = dict(num_beams=num_beams, max_new_tokens=8, do_sample=False)
        assert torch.equal(model.generate(**generate_inputs, **settings),
                           reference.generate(**generate_inputs, **settings))


def test_t5_config_reads_as_mgsa_t5_and_auto_classes(t5_dir, tmp_path):
    config = MgsaT5Config.from_pretrained(t5_dir, encoder_type="rhe")
    assert config.model_type == "mgsa_t5" and config.encoder_type == "rhe" and config.rhe_layers == [0]
    assert (config.encoder_layers, config.encoder_attention_heads, config.attention_dropout) == (2, 4, 0.0)
    model = MgsaT5ForConditionalGeneration(config)
    model.save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), MgsaT5Config)
    assert isinstance(AutoModelForSeq2SeqLM.from_pretrained(tmp_path), MgsaT5ForConditionalGeneration)
    with pytest.raises(StrictDataclassError, match="num_heads"):
        MgsaT5Config(num_heads=0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_on_t5(name, t5_dir, real_batch):
    """Each variant on a T5 checkpoint: only its own modules are new, forward + backward on a real batch with a finite
    loss and gradients on every new parameter, padding invariance, and 4-beam generation equal to each sentence
    alone."""
    fields = dict(VARIANTS[name])
    model, new_modules = load_as_mgsa(str(t5_dir), new_modules_init="random", **fields)  # the variant's own init
    assert isinstance(model, MgsaT5ForConditionalGeneration)
    reference = T5ForConditionalGeneration.from_pretrained(t5_dir).state_dict()
    parameters = dict(model.named_parameters())
    assert all(torch.equal(parameters[name], tensor) for name, tensor in reference.items() if name in parameters)
    new_parameters = [key for key in parameters if any(key.startswith(module + ".") for module in new_modules)]
    assert all(key not in reference for key in new_parameters)
    assert bool(new_parameters) != (fields.get("rhe_attention") == "dea")  # DEA is a mask: no parameters of its own

    batch, singles = real_batch
    model.train()
    output = model(**batch)
    assert torch.isfinite(output.loss)
    if model.config.encoder_type == "phrase_memory" and model.config.phrase_tag_supervision:
        assert output.tag_loss is not None and torch.isfinite(output.tag_loss)
    output.loss.backward()
    for key in new_parameters:
        assert parameters[key].grad is not None and parameters[key].grad.abs().sum() > 0, key

    model.eval()
    encoder = model.get_encoder()
    with torch.no_grad():
        batched = encoder(**source_inputs(batch)).last_hidden_state
        for row, single in enumerate(singles):
            alone = encoder(**single).last_hidden_state
            torch.testing.assert_close(batched[row, : alone.shape[1]], alone[0], atol=1e-4, rtol=1e-4)
        settings = dict(num_beams=4, max_new_tokens=6, do_sample=False)
        generated = model.generate(**source_inputs(batch), **settings)
        for row, single in enumerate(singles[:2]):
            alone = model.generate(**single, **settings)[0]
            assert generated[row, : alone.shape[0]].tolist() == alone.tolist()


def test_train_script_trains_the_t5_family_and_the_folder_loads(tmp_path):
    """`mgsa-hf train tiny_t5` (a packaged recipe by name) from a folder outside the repository."""
    command = [sys.executable, "-m", "mgsa_hf.cli", "train", "tiny_t5", f"data={DATA}", f"output_dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((run_folder(tmp_path) / "results.json").read_text())
    assert results["global_step"] == 4 and {row["split"] for row in results["scores"]} == {"validation", "test"}
    assert all(0.0 <= row["bleu"] <= 100.0 and 0.0 <= row["chrf"] <= 100.0 for row in results["scores"])
    assert "T5-style Transformer whose encoder is **rhe**" in (tmp_path / "README.md").read_text()

    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert isinstance(model, MgsaT5ForConditionalGeneration) and model.config.encoder_type == "rhe"
    settings = dict(num_beams=2, max_new_tokens=8)
    translator = pipeline("translation", model=str(tmp_path), device="cpu")
    expected = [row["translation_text"] for row in translator(SOURCES, **settings)]
    processor = translator.processor
    with torch.no_grad():
        ids = model.generate(**processor(SOURCES, return_tensors="pt"), **settings)
    assert [text.strip() for text in processor.tokenizer.batch_decode(ids, skip_special_tokens=True)] == expected

    script = (
        "import sys, json\n"
        "sys.modules['mgsa_hf'] = None\n"
        "from transformers import pipeline\n"
        f"translator = pipeline(model={str(tmp_path)!r}, trust_remote_code=True, device='cpu')\n"
        f"print(json.dumps([row['translation_text'] for row in translator({SOURCES!r}, **{settings!r})]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


@pytest.mark.parametrize("encoder_type", ["transformer", "phrase_representation"])
def test_decoder_deeper_than_encoder_generates_with_cache(encoder_type, real_batch):
    """Transformers sizes caches by T5's `num_layers` (the encoder's depth); a deeper decoder still caches every
    block, and cached beam search gives what recomputing everything gives."""
    config = MgsaT5Config(vocab_size=600, d_model=32, d_kv=8, d_ff=48, num_layers=1, num_decoder_layers=3,
                          num_heads=4, pad_token_id=2, eos_token_id=0, decoder_start_token_id=2,
                          encoder_type=encoder_type)
    torch.manual_seed(0)
    model = MgsaT5ForConditionalGeneration(config).eval()
    inputs = source_inputs(real_batch[0])
    settings = dict(num_beams=4, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    cached = model.generate(**inputs, **settings, use_cache=True)
    assert torch.equal(cached, model.generate(**inputs, **settings, use_cache=False))


def test_fresh_t5_family_model_uses_t5_initialisation():
    """A new model draws T5's own weights by T5's rules and the variants' own layers at d_model^-0.5 (transformers'
    default for unnamed layers of a T5 config would be std 1.0)."""
    config = MgsaT5Config(vocab_size=200, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_heads=4,
                          encoder_type="phrase_representation")
    torch.manual_seed(0)
    model = MgsaT5ForConditionalGeneration(config)
    attention = model.encoder.block[1].layer[0].SelfAttention
    feed_forward = model.encoder.block[1].layer[1].DenseReluDense
    expected = {
        attention.query_proj.weight: (64 * 16) ** -0.5,
        attention.key_proj.weight: 64**-0.5,
        attention.output_proj.weight: 64**-0.5,
        feed_forward.wi.weight: 64**-0.5,
        feed_forward.wo.weight: 256**-0.5,
        model.shared.weight: 1.0,
        model.encoder.block[0].phrase_combination.combine_token.weight: 64**-0.5,
        model.encoder.block[0].phrase_pooling.score_token.weight: 64**-0.5,
    }
    for weight, std in expected.items():
        assert weight.std().item() == pytest.approx(std, rel=0.15)
