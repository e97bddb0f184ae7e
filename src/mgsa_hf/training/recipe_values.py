"""What each key of a training recipe may hold: one table of types and ranges for the recipe's own keys
([`RECIPE_VALUES`]), one of ranges for the `training` section ([`TRAINING_RANGES`], the integer and float fields
of `Seq2SeqTrainingArguments` that Transformers takes without a check: `max_steps=-5` trained 12 steps, a negative
learning rate ascended the loss) and one for the `generation` section ([`generation_values`], the `GenerationConfig`
fields it takes without a check: `do_sample: "yes"` sampled). [`check_recipe_values`], [`check_training_ranges`] and
[`check_generation_section`] read a recipe against them when it is loaded, before any work, and name the key of a
value that does not fit.
"""

import difflib
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Value:
    """
    What a recipe key holds.

    Args:
        kinds (`tuple[str]`): the types it may have: `"int"` (a whole number, not a boolean), `"number"` (a finite int
            or float), `"bool"`, `"text"` (a string that is not blank), `"mapping"`, `"list"`, `"filled_list"` (a
            list that is not empty), `"ints"` (a non-empty list of whole numbers).
        minimum / above / maximum / below (`float`, *optional*): the bounds of a number, or of each number of a list
            (`>=`, `>`, `<=`, `<`).
        also (`tuple`): values allowed outside the bounds (`max_steps`' -1).
        choices (`tuple`): the only values allowed, where given.
        null (`bool`): whether null (unset) is allowed.
        meaning (`str`): what a special value means, said in the error.
        text (`str`): the error's words for what it must be, in place of those made from the rest.
    """

    kinds: tuple[str, ...]
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    below: float | None = None
    also: tuple = ()
    choices: tuple = ()
    null: bool = False
    meaning: str = ""
    text: str = ""

    def fits(self, value) -> bool:
        """Whether `value` is one this key may hold."""
        if value is None:
            return self.null
        if value in self.also and not isinstance(value, bool):
            return True
        if self.choices:
            return value in self.choices
        if not any(_KIND_CHECKS[kind](value) for kind in self.kinds):
            return False
        numbers = [item for item in (value if isinstance(value, list) else [value]) if _KIND_CHECKS["number"](item)]
        return all((self.minimum is None or number >= self.minimum) and (self.above is None or number > self.above)
                   and (self.maximum is None or number <= self.maximum) and (self.below is None or number < self.below)
                   for number in numbers)

    def describe(self) -> str:
        """What the key must be, in words (`"a whole number >= 1 or null (null: all)"`)."""
        if self.text:
            return self.text
        if self.choices:
            text = "one of " + ", ".join(repr(choice) for choice in self.choices)
        else:
            text = " or ".join(_KIND_NAMES[kind] for kind in self.kinds)
            bounds = [f"{sign} {_number(bound)}" for sign, bound in ((">=", self.minimum), (">", self.above),
                                                                     ("<=", self.maximum), ("<", self.below))
                      if bound is not None]
            text += (" " + " and ".join(bounds)) if bounds else ""
        text += "".join(f" or {value!r}" for value in self.also) + (" or null" if self.null else "")
        return text + (f" ({self.meaning})" if self.meaning else "")


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


_KIND_CHECKS = {
    "int": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "number": lambda value: isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
    "bool": lambda value: isinstance(value, bool),
    "text": lambda value: isinstance(value, str) and bool(value.strip()),
    "mapping": lambda value: isinstance(value, dict),
    "list": lambda value: isinstance(value, list),
    "filled_list": lambda value: isinstance(value, list) and bool(value),
    "ints": lambda value: isinstance(value, list) and bool(value) and all(_KIND_CHECKS["int"](item) for item in value),
}
_KIND_NAMES = {"int": "a whole number", "number": "a number", "bool": "true or false", "text": "a non-empty text",
               "mapping": "a mapping", "list": "a list", "filled_list": "a non-empty list",
               "ints": "a non-empty list of whole numbers"}

INT, NUMBER, BOOL, TEXT, MAPPING = ("int",), ("number",), ("bool",), ("text",), ("mapping",)
SEED = Value(INT, minimum=0, maximum=2**32 - 1)  # numpy's seeds

# every key of [`TrainConfig`]
RECIPE_VALUES = {
    "data": Value(TEXT, meaning="a folder, a file or a Hub dataset id"),
    "source_lang": Value(TEXT),
    "target_lang": Value(TEXT),
    "splits": Value(MAPPING),
    "hub_config": Value(TEXT, null=True),
    "trees": Value(MAPPING, null=True),
    "tree_column": Value(TEXT, null=True),
    "max_train_samples": Value(INT, minimum=1, null=True, meaning="null: all"),
    "max_eval_samples": Value(INT, minimum=1, null=True, meaning="null: all"),
    "max_test_samples": Value(INT, minimum=1, null=True, meaning="null: all"),
    "tokenizer": Value(TEXT, null=True),
    "vocab_size": Value(INT, minimum=1),
    "init_from": Value(TEXT, null=True),
    "init_new_modules": Value(TEXT, choices=("identity", "random")),
    "trust_remote_code": Value(BOOL),
    "backbone": Value(TEXT),
    "model": Value(MAPPING),
    "processor": Value(MAPPING),
    "training": Value(MAPPING),
    "generation": Value(MAPPING),
    "max_source_length": Value(INT, minimum=1),
    "max_target_length": Value(INT, minimum=1),
    "average_last_checkpoints": Value(INT, minimum=0, meaning="the last N checkpoints; 0: no averaging"),
    "resume_from_checkpoint": Value(("bool", "text"), null=True, meaning="a checkpoint folder"),
    "overwrite_output_dir": Value(BOOL),
    "output_dir": Value(TEXT, meaning="the model folder"),
    "examples": Value(("list",)),
    "reuse_cpu_memory": Value(BOOL),
    "max_tokens_per_batch": Value(INT, minimum=1, null=True),
    "threads": Value(INT, minimum=1, null=True, meaning="torch's CPU threads per process; null: torch's default"),
    "tokens_per_update": Value(INT, minimum=1, null=True, text="a positive whole number of tokens"),
    "collapse_check_step": Value(INT, minimum=0, null=True, meaning="0 or null: no check"),
    "collapse_min_spread": Value(NUMBER, minimum=0),
    "collapse_restarts": Value(INT, minimum=0),
    "prepared_dir": Value(TEXT, null=True),
    "num_proc": Value(INT, minimum=1, null=True, meaning="null: one"),
    "tokenizer_max_sentences": Value(INT, minimum=1, null=True, meaning="null: all"),
    "clean_min_words": Value(INT, minimum=0, null=True),
    "clean_max_words": Value(INT, minimum=1, null=True),
    "clean_max_ratio": Value(NUMBER, minimum=1, null=True),
    "prepare_in_shards": Value(BOOL),
}

# the `training` section's numbers that Transformers 5 takes without a check (their types are checked by its own
# parser, see `config._typed_training_values`); null leaves a field to Transformers
TRAINING_RANGES = {
    "max_steps": Value(INT, minimum=1, also=(-1,), meaning="-1: train for num_train_epochs"),
    "num_train_epochs": Value(NUMBER, above=0),
    "learning_rate": Value(NUMBER, above=0),
    "warmup_steps": Value(NUMBER, minimum=0, meaning="below 1: a share of the steps"),
    "per_device_train_batch_size": Value(INT, minimum=1),
    "per_device_eval_batch_size": Value(INT, minimum=1),
    "gradient_accumulation_steps": Value(INT, minimum=1),
    "eval_accumulation_steps": Value(INT, minimum=1),
    "eval_steps": Value(NUMBER, above=0, meaning="below 1: a share of the steps"),
    "save_steps": Value(NUMBER, above=0, meaning="below 1: a share of the steps"),
    "logging_steps": Value(NUMBER, above=0, meaning="below 1: a share of the steps"),
    "eval_delay": Value(NUMBER, minimum=0),
    "weight_decay": Value(NUMBER, minimum=0),
    "label_smoothing_factor": Value(NUMBER, minimum=0, below=1),
    "max_grad_norm": Value(NUMBER, minimum=0, meaning="0: no clipping"),
    "adam_beta1": Value(NUMBER, minimum=0, below=1),
    "adam_beta2": Value(NUMBER, minimum=0, below=1),
    "adam_epsilon": Value(NUMBER, above=0),
    "save_total_limit": Value(INT, minimum=1),
    "seed": SEED,
    "data_seed": SEED,
    "generation_num_beams": Value(INT, minimum=1),
    "generation_max_length": Value(INT, minimum=1),
    "dataloader_num_workers": Value(INT, minimum=0),
    "dataloader_prefetch_factor": Value(INT, minimum=1),
    "ddp_timeout": Value(INT, minimum=1, meaning="seconds"),
}


# the `generation` fields that GenerationConfig takes unchecked (its own checks let -2 or "a" through as a count,
# `do_sample: "yes"` sampled, a repetition penalty of 0 failed at the first evaluation naming `penalty`); the token
# ids are [`token_id`]s, below the vocabulary ([`generation_values`])
COUNT, FLAG, POSITIVE, ANY_NUMBER = Value(INT, minimum=0), Value(BOOL), Value(NUMBER, above=0), Value(NUMBER)
GENERATION_VALUES = {
    **dict.fromkeys(("no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "min_length", "min_new_tokens",
                     "max_new_tokens", "top_k", "num_return_sequences", "num_beam_groups"), COUNT),
    **dict.fromkeys(("do_sample", "renormalize_logits", "remove_invalid_values", "use_cache", "output_scores",
                     "output_logits", "output_attentions", "output_hidden_states", "return_dict_in_generate"), FLAG),
    **dict.fromkeys(("repetition_penalty", "encoder_repetition_penalty", "temperature", "guidance_scale"), POSITIVE),
    **dict.fromkeys(("length_penalty", "diversity_penalty", "top_p", "min_p", "typical_p", "epsilon_cutoff",
                     "eta_cutoff", "penalty_alpha", "max_time"), ANY_NUMBER),
    **dict.fromkeys(("bad_words_ids", "force_words_ids", "suppress_tokens", "begin_suppress_tokens"),
                    Value(("filled_list",), text="a non-empty list of token ids")),
}
GENERATION_TOKEN_IDS = ("forced_bos_token_id", "forced_eos_token_id", "pad_token_id", "bos_token_id", "eos_token_id",
                        "decoder_start_token_id")
# the generation settings the `training` section sets (and the run writes from there)
GENERATION_KEYS_IN_TRAINING = {"num_beams": "generation_num_beams", "max_length": "generation_max_length"}


def token_id(vocab_size: int | None = None, several: bool = False) -> Value:
    """The rule of a token id: a whole number >= 0, below `vocab_size` where given, or null; `several`: a non-empty
    list of them too (`eos_token_id`)."""
    within = f" below the vocabulary's {vocab_size}" if vocab_size else ""
    return Value(INT + (("ints",) if several else ()), minimum=0, below=vocab_size or None, null=True,
                 text=f"a token id (a whole number >= 0{within})")


def generation_values(vocab_size: int | None = None) -> dict[str, Value]:
    """The rules of the `generation` section: [`GENERATION_VALUES`] and the token ids, below `vocab_size`."""
    ids = {key: token_id(vocab_size, several=key == "eos_token_id") for key in GENERATION_TOKEN_IDS}
    return {**GENERATION_VALUES, **ids}


def check_recipe_values(config) -> None:
    """
    Check every key of a [`TrainConfig`] against [`RECIPE_VALUES`].

    Raises:
        `ValueError`: naming the first key whose value does not fit, what it must be and what it holds.
    """
    for key, rule in RECIPE_VALUES.items():
        if hasattr(config, key):
            _check(key, getattr(config, key), rule)
    # the sentences translated after training: a number failed there, with a traceback, once the run was done
    if odd := [example for example in getattr(config, "examples", None) or () if not _KIND_CHECKS["text"](example)]:
        raise ValueError(f"`examples` must be a list of sentences (text), got {odd[0]!r} among them.")


def check_training_ranges(section: dict) -> dict:
    """
    Check the numbers of a recipe's `training` section, read as `Seq2SeqTrainingArguments`' parser reads them
    (`config._typed_training_values`), against [`TRAINING_RANGES`]; returns `section`.

    Raises:
        `ValueError`: naming the first key (`training.<key>`) whose value does not fit.
    """
    for key, value in section.items():
        if key in TRAINING_RANGES and value is not None:
            _check(f"training.{key}", value, TRAINING_RANGES[key])
    return section


def _check(key: str, value, rule: Value) -> None:
    if not rule.fits(value):
        raise ValueError(f"`{key}` must be {rule.describe()}, got {value!r}.")


def check_generation_section(generation: dict, num_beams: int | None = None, vocab_size: int | None = None) -> None:
    """
    Check a recipe's `generation` section: names of `GenerationConfig` fields (but the beam size and length bound,
    which are `training` keys), values that fit [`generation_values`] (token ids below `vocab_size`), a
    `num_beam_groups` that divides `num_beams`, and values `GenerationConfig.validate` accepts with that beam size.

    Raises:
        `ValueError`: naming the first key (`generation.<key>`) that does not fit.
    """
    from transformers import GenerationConfig

    fields, rules = GenerationConfig().to_dict(), generation_values(vocab_size)
    for key, value in generation.items():
        if key in GENERATION_KEYS_IN_TRAINING:
            raise ValueError(f"`generation.{key}`: set training.{GENERATION_KEYS_IN_TRAINING[key]} instead (the run "
                             "scores and saves with it).")
        if key not in fields:
            near = difflib.get_close_matches(key, fields, n=1)
            raise ValueError(f"`generation.{key}` is no field of transformers' GenerationConfig"
                             + (f" (did you mean {near[0]!r}?)." if near else "."))
        if key in rules:
            _check(f"generation.{key}", value, rules[key])
    groups = generation.get("num_beam_groups") or 1
    if groups > 1 and (num_beams or 1) % groups:  # greedy search (one beam) ignored the groups without a word
        raise ValueError(f"`generation.num_beam_groups` ({groups}) must divide training.generation_num_beams "
                         f"({num_beams or 1}).")
    try:
        GenerationConfig(**{"num_beams": num_beams or 1, **generation}).validate(strict=True)
    except (ValueError, TypeError) as error:  # its message names the field (`early_stopping`)
        raise ValueError(f"`generation` {generation}: {' '.join(str(error).split())}") from error
