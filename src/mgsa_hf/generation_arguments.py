"""Checks of the `generate` parameters that count beams, sequences and tokens.

Transformers' `generate` (and `GenerationConfig.validate(strict=True)`) lets `num_beams=0`, `num_beams=2.5` or
`max_new_tokens="5"` through to a division by zero or a type error deep inside the decoding loop, and a `max_length`
beyond the model's position embeddings (`1e9`: tens of gigabytes allocated) into the decoding; these checks name the
parameter first.
"""

import numbers
from collections.abc import Mapping

from .input_checks import check_token_ids
from .weights_numerics import warn_non_finite_weights


# generate parameter -> the least value it takes (each an integer)
GENERATION_COUNTS = {
    "num_beams": 1,
    "num_return_sequences": 1,
    "max_length": 1,
    "max_new_tokens": 1,
    "min_length": 0,
    "min_new_tokens": 0,
}


def check_counts(arguments: Mapping, least_values: Mapping[str, int], prefix: str = "") -> None:
    """Raise a `ValueError` naming the first of `arguments` (named with `prefix`) that `least_values` lists and that is
    not an integer at least as large as its least value there. `None` (unset) passes."""
    for name, least in least_values.items():
        value = arguments.get(name)
        if value is None:
            continue
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
            raise ValueError(f"`{prefix}{name}` must be an integer >= {least}, got {value!r}.")


def check_generation_arguments(arguments: Mapping, prefix: str = "") -> None:
    """[`check_counts`] of `arguments` (generate keyword arguments, or a generation config's attributes, named with
    `prefix`) that count beams, sequences or tokens (`GENERATION_COUNTS`)."""
    check_counts(arguments, GENERATION_COUNTS, prefix)


def check_generation_length(arguments: Mapping, config_arguments: Mapping, prefix: str, positions: int | None) -> None:
    """
    Raise a `ValueError` when the translation length that `generate` is allowed (`max_new_tokens`, else
    `max_length`, from `arguments` or else from the generation config's `config_arguments`, named with `prefix`) is
    beyond the decoder's `positions` (`max_position_embeddings`; None for T5's relative positions, which have no
    limit). The decoder reads the start token and all but the last token generated: `max_length` (which counts the
    start token) may be `positions` + 1, `max_new_tokens` `positions`.
    """
    if positions is None:
        return
    for name, limit in (("max_new_tokens", positions), ("max_length", positions + 1)):
        given = arguments.get(name) is not None
        value = arguments.get(name) if given else config_arguments.get(name)
        if value is None:
            continue
        if value > limit:
            raise ValueError(
                f"`{'' if given else prefix}{name}` = {value} is beyond the model's positions: the target sequence "
                f"has position embeddings for `max_position_embeddings` = {positions} tokens, so `max_new_tokens` can "
                f"be at most {positions} (`max_length` at most {positions + 1})."
            )
        return  # `max_new_tokens` is used where both are set


class CheckedGenerationMixin:
    """Placed before `GenerationMixin` in a model's bases: `generate` checks its counting parameters
    ([`check_generation_arguments`]), those passed and those of the generation config it decodes with (the one
    passed, else the model's), the translation length against the model's positions ([`check_generation_length`]),
    the `input_ids` (a 2-d batch of ids within the vocabulary), and warns of weights holding NaN or inf (read
    again only when they changed)."""

    def generate(self, inputs=None, generation_config=None, **kwargs):
        check_generation_arguments(kwargs)
        prefix, config_arguments = "model.generation_config.", {}
        if generation_config is not None:
            prefix, config_arguments = "generation_config.", vars(generation_config)
        elif getattr(self, "generation_config", None) is not None:
            config_arguments = vars(self.generation_config)
        check_generation_arguments(config_arguments, prefix=prefix)
        check_generation_length(kwargs, config_arguments, prefix,
                                getattr(self.config, "max_position_embeddings", None))
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        if input_ids is not None:
            check_token_ids(input_ids, self.get_input_embeddings().num_embeddings, "input_ids")
        warn_non_finite_weights(self, "generate")
        return super().generate(inputs, generation_config, **kwargs)
