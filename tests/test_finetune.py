"""Upgrading a trained model with a variant and fine-tuning it: the upgraded model starts computing what its source
computed (as far as the variant allows), the variant's modules still train, and `init_from` keeps the checkpoint's
own configuration, tokenizer and processor settings."""

import json
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_DIR
from transformers import T5Config, T5ForConditionalGeneration

from mgsa_hf import MgsaForConditionalGeneration, MgsaT5ForConditionalGeneration
from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.conversion import load_as_mgsa
from mgsa_hf.training.ownership import run_folder
from mgsa_hf.training.run import train


REPO = Path(__file__).resolve().parents[1]
DATA = MULTI30K_DIR
TINY = REPO / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batch(multi30k_processor, multi30k_val):
    """Six Multi30k val pairs through the processor, every syntax field included."""
    sources, targets = multi30k_val[0][:6], multi30k_val[1][:6]
    return dict(multi30k_processor(sources, text_target=targets, return_tensors="pt"))


@pytest.fixture(scope="module")
def source_folder(tmp_path_factory, multi30k_processor, tiny_config):
    """A plain (transformer) model saved to a folder, with weights at a scale where logits differ visibly when the
    attention changes (init_std 0.3; a model at the usual 0.02 has logits near 0)."""
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", init_std=0.3))
    folder = tmp_path_factory.mktemp("source")
    model.save_pretrained(folder)
    return folder


def logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(**batch).logits


# (variant fields, largest |Δ logit| the identity start may leave): exact where the variant has an exact identity,
# else the gate at σ(-8) / LPEA's bias at ~1e-4 (the source's logits reach ~7 here)
STARTS_AS_SOURCE = {
    "hybrid": ({"encoder_type": "hybrid"}, 5e-3),
    "hybrid (concat)": ({"encoder_type": "hybrid", "hybrid_combination": "concat"}, 1e-5),
    "rhe": ({"encoder_type": "rhe"}, 1e-3),
    "rhe (sea_all)": ({"encoder_type": "rhe", "rhe_mode": "sea_all"}, 1e-3),
}


@pytest.mark.parametrize("name", list(STARTS_AS_SOURCE))
def test_upgrade_starts_as_its_source(name, source_folder, batch):
    """`from_pretrained(folder, encoder_type=...)` (the README's upgrade) and `load_as_mgsa` start the variant's new
    modules so that the model computes what the plain checkpoint computed; the variant's own random initialisation
    does not."""
    fields, tolerance = STARTS_AS_SOURCE[name]
    expected = logits(MgsaForConditionalGeneration.from_pretrained(source_folder), batch)
    upgraded = MgsaForConditionalGeneration.from_pretrained(source_folder, **fields)
    assert upgraded.config.encoder_type == fields["encoder_type"]
    assert (logits(upgraded, batch) - expected).abs().max() <= tolerance
    converted, new_modules = load_as_mgsa(str(source_folder), **fields)
    assert new_modules and (logits(converted, batch) - expected).abs().max() <= tolerance
    torch.manual_seed(0)
    randomly = MgsaForConditionalGeneration.from_pretrained(source_folder, new_modules_init="random", **fields)
    assert (logits(randomly, batch) - expected).abs().max() > 20 * tolerance


@pytest.mark.parametrize("encoder_type", ["phrase_representation", "phrase_memory"])
def test_upgrades_that_cannot_start_as_their_source(encoder_type, source_folder, batch):
    """On Marian, PR's added sub-layers end in LayerNorms of their own and MG-SA's phrase heads attend over phrases:
    neither computes the source's function at the start (README, "Fine-tuning a trained model"); PR's combinations
    start at 0 all the same."""
    expected = logits(MgsaForConditionalGeneration.from_pretrained(source_folder), batch)
    upgraded = MgsaForConditionalGeneration.from_pretrained(source_folder, encoder_type=encoder_type)
    assert (logits(upgraded, batch) - expected).abs().max() > 0.1
    combinations = [module for name, module in upgraded.named_modules() if name.endswith("phrase_combination")]
    assert all(module.combine_out.weight.abs().sum() == 0 for module in combinations)
    assert bool(combinations) == (encoder_type == "phrase_representation")


def test_phrase_representation_on_t5_starts_as_t5(tmp_path, multi30k_processor, batch):
    """On T5 (pre-norm) PR's sub-layers add to the residual stream only, so starting them at 0 is exact."""
    tokenizer = multi30k_processor.tokenizer
    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, dropout_rate=0.0, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id, initializer_factor=5.0,
    ))
    t5.save_pretrained(tmp_path)
    expected = logits(t5, {key: batch[key] for key in ("input_ids", "attention_mask", "labels")})
    upgraded = MgsaT5ForConditionalGeneration.from_pretrained(tmp_path, encoder_type="phrase_representation")
    assert (logits(upgraded, batch) - expected).abs().max() <= 1e-5 * expected.abs().max()
    randomly = MgsaT5ForConditionalGeneration.from_pretrained(tmp_path, encoder_type="phrase_representation",
                                                              new_modules_init="random")
    assert (logits(randomly, batch) - expected).abs().max() > 1e-2 * expected.abs().max()


@pytest.mark.parametrize("fields", [
    {"encoder_type": "hybrid"}, {"encoder_type": "rhe"}, {"encoder_type": "phrase_representation"},
], ids=lambda fields: fields["encoder_type"])
def test_identity_start_still_trains(fields, source_folder, batch):
    """Every new parameter receives a gradient within two Adam steps (PR's W4 in the first, then the rest; the gate
    and LPEA's bias in the first)."""
    model, new_modules = load_as_mgsa(str(source_folder), **fields)
    model.train()
    new_parameters = {name: parameter for name, parameter in model.named_parameters()
                      if any(name.startswith(f"{module}.") for module in new_modules)}
    assert new_parameters
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    reached = set()
    for _ in range(2):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        reached |= {name for name, parameter in new_parameters.items()
                    if parameter.grad is not None and parameter.grad.abs().sum() > 0}
        optimizer.step()
    assert reached == set(new_parameters)


def test_from_pretrained_rejects_an_unknown_start(source_folder):
    with pytest.raises(ValueError, match="new_modules_init"):
        MgsaForConditionalGeneration.from_pretrained(source_folder, encoder_type="rhe", new_modules_init="zeros")


def test_init_from_keeps_the_checkpoints_configuration(tmp_path):
    """A scratch recipe's `model` section (the packaged default, 128 wide) does not rebuild a checkpoint given as
    `init_from`; `model.*` overrides and a fine-tuning file's own `model` section do."""
    config = load_train_config(None, ["init_from=some/folder", "model.encoder_type=rhe"])
    assert config.model == {"encoder_type": "rhe"}
    assert load_train_config(TINY, ["init_from=some/folder"]).model == {}
    assert load_train_config(None, []).model["d_model"] == 128  # training from scratch: unchanged
    finetune = tmp_path / "finetune.yaml"
    finetune.write_text("init_from: some/folder\nmodel: {dropout: 0.2}\n")
    assert load_train_config(finetune, ["model.encoder_type=hybrid"]).model == {"dropout": 0.2,
                                                                                 "encoder_type": "hybrid"}
    packaged = load_train_config(REPO / "src" / "mgsa_hf" / "training" / "recipes" / "finetune.yaml",
                                 ["model.encoder_type=rhe"])
    assert packaged.init_from and packaged.model == {"encoder_type": "rhe"}


def test_finetune_a_saved_checkpoint_through_the_recipe(tmp_path):
    """Train a plain model (48 wide, 2-level phrases in its processor), then fine-tune its folder as RHE with the
    tiny recipe (32 wide in its `model` section): the width, tokenizer and processor settings are the checkpoint's;
    then fine-tune the RHE folder again with its tokenizer named explicitly (what failed with 'unexpected
    relative_proj' when the recipe's `encoder_type: transformer` applied over it)."""
    base = tmp_path / "base"
    train(load_train_config(TINY, [f"data={DATA}", f"output_dir={base}", "training.max_steps=2",
                                   "model.d_model=48", "processor.phrase_levels=2"]))
    upgraded = tmp_path / "rhe"
    results, model = train(load_train_config(TINY, [
        f"data={DATA}", f"output_dir={upgraded}", f"init_from={base}", "model.encoder_type=rhe",
        "training.max_steps=2",
    ]))
    assert results["encoder_type"] == "rhe" and model.config.d_model == 48
    assert not (run_folder(upgraded) / "tokenizer").exists()  # no vocabulary trained anew
    assert (json.loads((upgraded / "tokenizer.json").read_text())["model"]
            == json.loads((base / "tokenizer.json").read_text())["model"])
    assert json.loads((upgraded / "processor_config.json").read_text())["phrase_levels"] == 2

    again = tmp_path / "rhe-again"
    results, model = train(load_train_config(TINY, [
        f"data={DATA}", f"output_dir={again}", f"init_from={upgraded}", f"tokenizer={upgraded}",
        "training.max_steps=1",
    ]))
    assert results["encoder_type"] == "rhe" and model.config.d_model == 48


def test_init_from_needs_a_model_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="init_from=.*missing'.*no such folder"):
        train(load_train_config(TINY, [f"data={DATA}", f"output_dir={tmp_path / 'out'}",
                                       f"init_from={tmp_path / 'missing'}"]))


def test_converter_keeps_the_processor_settings_and_parses_only_for_syntax(tmp_path, source_folder,
                                                                          multi30k_processor):
    """The converted folder's processor has the source processor's settings, and parses with spaCy only for encoder
    types whose logits read syntax."""
    from mgsa_hf import MgsaProcessor
    from mgsa_hf.training.conversion import convert_checkpoint

    source = tmp_path / "source"
    MgsaForConditionalGeneration.from_pretrained(source_folder).save_pretrained(source)
    MgsaProcessor(multi30k_processor.tokenizer, phrase_levels=2).save_pretrained(source)
    for encoder_type, parses in (("transformer", False), ("rhe", True)):
        report = convert_checkpoint(str(source), str(tmp_path / encoder_type), encoder_type)
        assert report["processor_saved"] and report["encoder_type"] == encoder_type
        processor = MgsaProcessor.from_pretrained(tmp_path / encoder_type)
        assert (processor.with_syntax, processor.phrase_levels) == (parses, 2)
