"""The source syntax of one forward pass: [`MgsaSyntaxInputs`], packed once from the named syntax fields of a
`forward` and handed by the encoder to its variant's layers."""

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .syntax_fields import SOURCE_SYNTAX_PAD_VALUES


# the source syntax fields a forward takes by name (`syntax_fields.py` gives their shapes and padding values)
SYNTAX_INPUT_NAMES = tuple(SOURCE_SYNTAX_PAD_VALUES)


@dataclass
class MgsaSyntaxInputs:
    """
    The source-side inputs of one encoder forward pass, beyond the tokens themselves.

    Field names, shapes and padding values are those of `syntax_fields.py`; every tensor is batch first and aligned
    with `input_ids` (length `L`). `padding_mask` (B, L) is `True` on real tokens; the encoder sets it. A `forward`
    takes the fields by name (`Trainer` and `generate` pass inputs by the signature's names) and packs them once
    ([`pack`]); the encoder hands them to the variant, which turns the fields it reads into what its layers share
    (phrase partitions, relations) once per forward ([`Variant.layer_inputs`]).
    """

    padding_mask: torch.BoolTensor | None = None
    word_ids: torch.LongTensor | None = None
    head_word_ids: torch.LongTensor | None = None
    phrase_ids: torch.LongTensor | None = None
    phrase_tags: torch.LongTensor | None = None
    pr_phrase_ids: torch.LongTensor | None = None
    local_phrase_start: torch.LongTensor | None = None
    local_phrase_end: torch.LongTensor | None = None
    tree_depth: torch.LongTensor | None = None

    @classmethod
    def pack(cls, arguments: Mapping[str, object]) -> "MgsaSyntaxInputs":
        """The syntax fields among a forward's `arguments` (its `locals()`), by their names in `syntax_fields.py`."""
        return cls(**{name: arguments.get(name) for name in SYNTAX_INPUT_NAMES})

    def with_padding(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None) -> "MgsaSyntaxInputs":
        """These fields for a batch of source embeddings (B, L, D) with its 0/1 `attention_mask` (B, L) (None: no
        padding)."""
        if attention_mask is None:
            padding_mask = torch.ones(inputs_embeds.shape[:2], dtype=torch.bool, device=inputs_embeds.device)
        else:
            padding_mask = attention_mask.bool()
        return type(self)(padding_mask=padding_mask, **{name: getattr(self, name) for name in SYNTAX_INPUT_NAMES})

    def require(self, *names: str, needed_by: str) -> None:
        """Raise a clear error when a syntax field that `needed_by` reads was not given."""
        missing = [name for name in names if getattr(self, name) is None]
        if missing:
            raise ValueError(
                f"{needed_by} needs the source syntax field(s) {missing}: pass the output of `MgsaProcessor` "
                f"(e.g. `model(**processor(texts, return_tensors='pt'))`)."
            )
        length = self.padding_mask.shape[-1]
        for name in names:
            if getattr(self, name).shape[-1] != length:
                raise ValueError(
                    f"`{name}` has length {getattr(self, name).shape[-1]} but `input_ids` has length {length}: syntax "
                    "fields must be padded and truncated together with the tokens."
                )


def require_inputs(syntax, inputs_class: type, layer: object) -> None:
    """A clear error when a variant's layer is called without the inputs its encoder makes for it once per forward
    ([`Variant.layer_inputs`])."""
    if not isinstance(syntax, inputs_class):
        raise ValueError(
            f"{type(layer).__name__} reads `syntax={inputs_class.__name__}.from_syntax(config, MgsaSyntaxInputs(...), "
            f"hidden_states)`, as the encoder passes it; got {type(syntax).__name__}."
        )
