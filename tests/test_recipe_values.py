"""Every recipe key's type and range is checked when the recipe is loaded, naming the key: values that were taken
and meant nothing (`training.max_steps=-5` trained 12 steps, `tokenizer_max_sentences=-3` a 3-token tokenizer)."""

import dataclasses

import pytest

from mgsa_hf.training.config import TrainConfig, load_train_config
from mgsa_hf.training.recipe_values import RECIPE_VALUES, TRAINING_RANGES


@pytest.mark.parametrize(("override", "match"), [
    ("training.max_steps=-5", r"`training.max_steps` must be a whole number >= 1 or -1 .*got -5"),
    ("training.max_steps=0", r"`training.max_steps` must be .*got 0"),
    ("tokenizer_max_sentences=-3", r"`tokenizer_max_sentences` must be a whole number >= 1 or null .*got -3"),
    ("tokenizer_max_sentences=0", r"`tokenizer_max_sentences` must be .*got 0"),
    ("num_proc=abc", r"`num_proc` must be a whole number >= 1 or null .*got 'abc'"),
    ("output_dir=", r"`output_dir` must be a non-empty text .*got None"),
    ("output_dir=' '", r"`output_dir` must be a non-empty text .*got ' '"),
    ("training.num_train_epochs=0", r"`training.num_train_epochs` must be a number > 0, got 0"),
    ("training.learning_rate=-1e-3", r"`training.learning_rate` must be a number > 0, got -0.001"),
    ("training.per_device_train_batch_size=0", r"`training.per_device_train_batch_size` must be .* >= 1, got 0"),
    ("training.gradient_accumulation_steps=-2", r"`training.gradient_accumulation_steps` must be .*got -2"),
    ("training.label_smoothing_factor=1.5", r"`training.label_smoothing_factor` must be a number >= 0 and < 1"),
    ("training.seed=-1", r"`training.seed` must be a whole number >= 0 and <= 4294967295, got -1"),
    ("training.max_grad_norm=-1", r"`training.max_grad_norm` must be a number >= 0 \(0: no clipping\), got -1"),
    ("training.save_total_limit=0", r"`training.save_total_limit` must be a whole number >= 1, got 0"),
    ("vocab_size=0", r"`vocab_size` must be a whole number >= 1, got 0"),
    ("vocab_size=true", r"`vocab_size` must be a whole number >= 1, got True"),
    ("max_train_samples=0", r"`max_train_samples` must be .*got 0"),
    ("max_source_length=1.5", r"`max_source_length` must be a whole number >= 1, got 1.5"),
    ("collapse_min_spread=.nan", r"`collapse_min_spread` must be a number >= 0, got nan"),
    ("init_new_modules=zeros", r"`init_new_modules` must be one of 'identity', 'random', got 'zeros'"),
    ("overwrite_output_dir=yes", r"`overwrite_output_dir` must be true or false, got 'yes'"),
    ("training=5", r"`training` must be a mapping, got 5"),
    ("generation.no_repeat_ngram=4", r"`generation.no_repeat_ngram` is no field .*'no_repeat_ngram_size'"),
    ("generation.num_beams=4", r"`generation.num_beams`: set training.generation_num_beams instead"),
    ("generation.no_repeat_ngram_size=-2", r"`generation.no_repeat_ngram_size` must be a whole number >= 0, got -2"),
    ("generation.early_stopping=maybe", r"`generation` .*`early_stopping` must be a boolean or 'never'"),
])
def test_a_value_that_means_nothing_is_refused_at_load(tmp_path, override, match):
    """Each value fails in `load_train_config`, naming its key, before any folder is made."""
    with pytest.raises(ValueError, match=match):
        load_train_config("tiny", [f"output_dir={tmp_path / 'model'}", override])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("override", ["training.max_steps=-1", "training.max_steps='7'", "training.warmup_steps=0.1",
                                      "tokenizer_max_sentences=null", "num_proc=2", "collapse_check_step=0",
                                      "resume_from_checkpoint=false", "training.eval_steps=null",
                                      "generation.no_repeat_ngram_size=4"])
def test_values_with_a_meaning_load(tmp_path, override):
    config = load_train_config("tiny", [f"output_dir={tmp_path / 'model'}", override])
    if override == "training.max_steps='7'":  # read as the Trainer's own parser reads it
        assert config.training["max_steps"] == 7


def test_every_key_has_a_rule_and_every_recipe_fits():
    """The table names every key of `TrainConfig` (a new key needs its rule), every rule of the `training` section is
    a field of `Seq2SeqTrainingArguments`, and the packaged recipes load."""
    from transformers import Seq2SeqTrainingArguments

    from mgsa_hf.training.catalogue import RECIPES

    assert {field.name for field in dataclasses.fields(TrainConfig)} <= set(RECIPE_VALUES)
    assert set(TRAINING_RANGES) <= {field.name for field in dataclasses.fields(Seq2SeqTrainingArguments)}
    for recipe in sorted(RECIPES.glob("*.yaml")):
        load_train_config(recipe, ["init_from=a/checkpoint"] if "finetune" in recipe.name else [])
