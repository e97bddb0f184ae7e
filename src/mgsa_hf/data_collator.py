"""Batching of [`MgsaProcessor`] outputs: every field padded with its own value."""

from dataclasses import dataclass
from typing import Any

from transformers import BatchEncoding

from .syntax_fields import LEVELLED_SYNTAX_FIELDS, SOURCE_SYNTAX_PAD_VALUES


LABEL_PAD_TOKEN_ID = -100
# fields padded to the target length instead of the source length
TARGET_FIELDS = ("labels", "decoder_attention_mask")


def pad_batch(
    batch: dict[str, list],
    pad_token_id: int,
    label_pad_token_id: int = LABEL_PAD_TOKEN_ID,
    length: int | None = None,
    pad_to_multiple_of: int | None = None,
) -> dict[str, list]:
    """Right-pads the per-sentence lists of a batch to a common length, each field with its pad value.

    `input_ids` get `pad_token_id`, `attention_mask` and `decoder_attention_mask` 0, `labels` `label_pad_token_id`,
    the syntax fields their values in [`~mgsa_hf.syntax_fields.SOURCE_SYNTAX_PAD_VALUES`] (levelled fields are
    padded along their last dimension). Source fields are padded to the longest `input_ids` (or `length` when it is
    longer), target fields to the longest `labels`; both rounded up to a multiple of `pad_to_multiple_of`. Fields
    without a known pad value are left as they are.

    Args:
        batch: field name -> one list (or 1-d / 2-d tensor) per sentence.
    """
    if "input_ids" not in batch:
        raise ValueError(f"A batch to pad needs `input_ids`, got fields {sorted(batch)}.")
    if pad_token_id is None:
        raise ValueError("Padding needs a pad token id: the tokenizer has no pad token.")
    pad_values = {
        "input_ids": pad_token_id,
        "attention_mask": 0,
        "labels": label_pad_token_id,
        "decoder_attention_mask": 0,
        **SOURCE_SYNTAX_PAD_VALUES,
    }
    batch = {name: [_as_list(row) for row in rows] if name in pad_values else rows for name, rows in batch.items()}
    for name in LEVELLED_SYNTAX_FIELDS:
        if name in batch:
            _check_level_counts(name, batch[name])
    source_length = _padded_length(batch["input_ids"], length, pad_to_multiple_of)
    target_length = _padded_length(batch["labels"], None, pad_to_multiple_of) if "labels" in batch else 0
    padded = {}
    for name, rows in batch.items():
        if name not in pad_values:
            padded[name] = rows
            continue
        size, value = (target_length if name in TARGET_FIELDS else source_length), pad_values[name]
        if name in LEVELLED_SYNTAX_FIELDS:
            padded[name] = [[level + [value] * (size - len(level)) for level in levels] for levels in rows]
        else:
            padded[name] = [row + [value] * (size - len(row)) for row in rows]
    return padded


def _check_level_counts(name: str, rows: list) -> None:
    """A `ValueError` when the rows of a levelled field (K, L) have different numbers K of levels: they were made by
    processors with different `phrase_levels`, and cannot form one (B, K, L) tensor."""
    rows_by_count = {}
    for index, levels in enumerate(rows):
        rows_by_count.setdefault(len(levels), []).append(index)
    if len(rows_by_count) > 1:
        counts = "; ".join(f"{count} in rows {_row_list(indices)}" for count, indices in sorted(rows_by_count.items()))
        raise ValueError(f"`{name}` has different numbers of levels in one batch ({counts}): the rows were made by "
                         "processors with different `phrase_levels`; encode them all with the model's processor.")


def _row_list(indices: list[int], shown: int = 10) -> str:
    """`[0, 2, 5]`, or the first `shown` indices and how many more."""
    more = f" and {len(indices) - shown} more" if len(indices) > shown else ""
    return f"{indices[:shown]}{more}"


def _holds_text(value) -> bool:
    """Whether a row's value is text, or a list holding text (which no tensor can hold)."""
    if isinstance(value, (str, bytes)):
        return True
    return isinstance(value, (list, tuple)) and any(_holds_text(item) for item in value[:1])


def _check_no_text(batch: dict[str, list]) -> None:
    """A `ValueError` naming the field and rows of a batch that hold text (e.g. a dataset's raw `translation` column),
    instead of transformers' "Unable to create tensor" when the batch is turned into tensors."""
    for name, rows in batch.items():
        rows_with_text = [index for index, value in enumerate(rows) if _holds_text(value)]
        if rows_with_text:
            example = rows[rows_with_text[0]]
            raise ValueError(
                f"MgsaDataCollator: `{name}` of rows {_row_list(rows_with_text)} holds text ({str(example)[:40]!r}), "
                "which cannot be batched into a tensor: remove the column from the dataset "
                f"(`dataset.remove_columns(['{name}'])`), or keep `remove_unused_columns=True` in the training "
                "arguments so that the Trainer drops the columns the model does not read."
            )


def _as_list(row):
    return row.tolist() if hasattr(row, "tolist") else row


def _padded_length(rows, length, multiple):
    longest = max(map(len, rows), default=0)
    if length is not None:
        longest = max(longest, length)
    if multiple:
        longest = -(-longest // multiple) * multiple
    return longest


@dataclass
class MgsaDataCollator:
    """Collates [`MgsaProcessor`] outputs (e.g. rows of `processor.map_dataset(...)`) into a padded batch of tensors;
    the `data_collator` of a `Seq2SeqTrainer`.

    Every field is padded with its own value (see [`pad_batch`]): `input_ids` with the pad token, `labels` with
    -100 (ignored by the loss), the syntax fields with the values in
    [`~mgsa_hf.syntax_fields.SOURCE_SYNTAX_PAD_VALUES`]. Rows without `attention_mask` (a prepared corpus does not
    store it: it is all ones before padding) get one of ones, padded with 0. With a `model` that has
    `prepare_decoder_input_ids_from_labels`, `decoder_input_ids` are added (as `DataCollatorForSeq2Seq` does, for
    label smoothing).

    Args:
        tokenizer ([`PreTrainedTokenizerBase`], *optional*): gives the pad token id.
        model ([`PreTrainedModel`], *optional*): makes `decoder_input_ids` from `labels`.
        pad_token_id (`int`, *optional*): the pad token id, when no tokenizer is given.
        label_pad_token_id (`int`, defaults to -100): padding of `labels`.
        pad_to_multiple_of (`int`, *optional*): round padded lengths up to a multiple of this.
        return_tensors (`str`, defaults to `"pt"`): `"pt"` or `"np"`.

    Raises:
        ValueError: naming the rows when some rows of a batch have a field that others lack (e.g. `labels`), or
            when rows made by processors with different `phrase_levels` have different numbers of levels, or when a
            field holds text (a raw column the collator cannot turn into a tensor).
    """

    tokenizer: Any = None
    model: Any = None
    pad_token_id: int | None = None
    label_pad_token_id: int = LABEL_PAD_TOKEN_ID
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __post_init__(self):
        if self.pad_token_id is None:
            if self.tokenizer is None or self.tokenizer.pad_token_id is None:
                raise ValueError("MgsaDataCollator needs a tokenizer with a pad token, or `pad_token_id`.")
            self.pad_token_id = self.tokenizer.pad_token_id

    def __call__(self, features: list[dict]) -> BatchEncoding:
        if not features:
            raise ValueError("MgsaDataCollator got an empty list of features.")
        fields = {name: None for feature in features for name in feature}  # in order of first appearance
        for name in fields:
            missing = [index for index, feature in enumerate(features) if name not in feature]
            if missing:
                having = [index for index, feature in enumerate(features) if name in feature]
                raise ValueError(f"MgsaDataCollator: rows {_row_list(having)} have `{name}` but rows "
                                 f"{_row_list(missing)} do not; every row of a batch needs the same fields (e.g. "
                                 "all with `labels`, from `text_target`, or none).")
        batch = {name: [feature[name] for feature in features] for name in fields}
        _check_no_text(batch)
        if "input_ids" in batch and "attention_mask" not in batch:  # rows stored without it: all ones before padding
            batch["attention_mask"] = [[1] * len(ids) for ids in batch["input_ids"]]
        batch = pad_batch(
            batch, self.pad_token_id, self.label_pad_token_id, pad_to_multiple_of=self.pad_to_multiple_of
        )
        encoding = BatchEncoding(batch, tensor_type=self.return_tensors)
        prepare = getattr(self.model, "prepare_decoder_input_ids_from_labels", None)
        if "labels" in encoding and prepare is not None:
            encoding["decoder_input_ids"] = prepare(labels=encoding["labels"])
        return encoding
