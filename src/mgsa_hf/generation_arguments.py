"""Checks of the `generate` parameters that count beams, sequences and tokens.

Transformers' `generate` (and `GenerationConfig.validate(strict=True)`) lets `num_beams=0`, `num_beams=2.5` or
`max_new_tokens="5"` through to a division by zero or a type error deep inside the decoding loop; these checks name
the parameter first.
"""

import numbers
from collections.abc import Mapping


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


class CheckedGenerationMixin:
    """Placed before `GenerationMixin` in a model's bases: `generate` checks its counting parameters
    ([`check_generation_arguments`]), those passed and those of the generation config it decodes with (the one
    passed, else the model's)."""

    def generate(self, inputs=None, generation_config=None, **kwargs):
        check_generation_arguments(kwargs)
        if generation_config is not None:
            check_generation_arguments(vars(generation_config), prefix="generation_config.")
        elif getattr(self, "generation_config", None) is not None:
            check_generation_arguments(vars(self.generation_config), prefix="model.generation_config.")
        return super().generate(inputs, generation_config, **kwargs)
