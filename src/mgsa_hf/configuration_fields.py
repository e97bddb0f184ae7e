"""How a variant declares its configuration fields: validators for `huggingface_hub`'s strict dataclasses, which run
each on construction and on every assignment, after the check of the field's type (their errors name the field)."""

from huggingface_hub.dataclasses import validated_field


def refuse_bool(value):
    """`True` is an `int` to Python: huggingface_hub >= 2 refuses it for an `int` / `float` field, 1.x takes it."""
    if isinstance(value, bool) or (isinstance(value, (list, tuple)) and any(isinstance(item, bool) for item in value)):
        raise TypeError(f"expected a number, got {value!r}.")


def at_least(minimum: float):
    """A number (or None) that is at least `minimum`."""

    def check(value):
        refuse_bool(value)
        if value is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}, got {value!r}.")

    return check


def in_unit_interval(value):
    """A number (or None) in [0, 1]."""
    refuse_bool(value)
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"must be in [0, 1], got {value!r}.")


def smoothing(value):
    """A label smoothing ε in [0, 1)."""
    refuse_bool(value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"must be in [0, 1), got {value!r}.")


def items_at_least(minimum: int, non_empty: bool = True):
    """A list (or None) of integers, each at least `minimum`, not empty unless `non_empty=False`."""

    def check(value):
        if value is None:
            return
        refuse_bool(value)
        if non_empty and not value:
            raise ValueError("must not be empty.")
        if any(item < minimum for item in value):
            raise ValueError(f"every entry must be >= {minimum}, got {value!r}.")

    return check


def checked_field(default, *validators):
    """A dataclass field with a default and the validators above."""
    return validated_field(list(validators), default=default)
