"""The outputs of the MGSA models: what a layer contributes besides its hidden states ([`MgsaLayerOutput`]), the
encoder's ([`MgsaEncoderOutput`]) and the encoder-decoders' outputs, and the keyword arguments a decoder takes from
the source ([`MgsaDecoderKwargs`])."""

from dataclasses import dataclass, fields

import torch
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput
from transformers.utils import TransformersKwargs


@dataclass
class MgsaLayerOutput:
    """
    What an encoder layer contributes besides its hidden states: a layer returns it beside its hidden states (what
    its self-attention returned as its third output, or what the layer's own sub-layers made), and the encoder gathers
    the layers' into [`MgsaEncoderOutput`] ([`gather`]). Plain layers return it empty.

    Attributes:
        tag_loss (`(B,)`): MG-SA phrase-tag cross-entropy per sentence (Eq. 10).
        gates (`(B, L)` or `(B, H, L)`): hybrid local/global gates (Eq. 5).
        head_labels (`(B, H)`): RHE head labels, 1 = important, 0 = redundant (Eq. 10).
        phrase_states (tuple of `(B, P, D)`): PR phrase vectors pooled by this layer, from its input (level k for layer
            k) and, in the last layer, from its output (level d).
        phrase_mask (`(B, P)`): PR, `True` on real phrases.
    """

    tag_loss: torch.Tensor | None = None
    gates: torch.Tensor | None = None
    head_labels: torch.LongTensor | None = None
    phrase_states: tuple[torch.Tensor, ...] = ()
    phrase_mask: torch.BoolTensor | None = None

    def to_tuple(self) -> tuple[torch.Tensor | None, ...]:
        """The fields as one flat tuple (tensors and Nones), the phrase levels last; [`from_tuple`] rebuilds it."""
        return (self.tag_loss, self.gates, self.head_labels, self.phrase_mask, *self.phrase_states)

    @classmethod
    def from_tuple(cls, values: tuple[torch.Tensor | None, ...]) -> "MgsaLayerOutput":
        """The output that [`to_tuple`] flattened into `values`."""
        tag_loss, gates, head_labels, phrase_mask, *phrase_states = values
        return cls(tag_loss, gates, head_labels, tuple(phrase_states), phrase_mask)

    @staticmethod
    def gather(layer_outputs: list["MgsaLayerOutput"]) -> dict[str, object]:
        """The [`MgsaEncoderOutput`] fields of the layers' contributions, in layer order: the mean of the tag losses,
        the gates and head labels of each layer that has them, PR's phrase levels stacked as (B, levels, P, D) and the
        phrase mask (every layer's is the same)."""

        def present(name: str) -> list:
            return [getattr(output, name) for output in layer_outputs if getattr(output, name) is not None]

        tag_losses, phrase_masks = present("tag_loss"), present("phrase_mask")
        phrase_states = [states for output in layer_outputs for states in output.phrase_states]
        return {
            "tag_loss": torch.stack(tag_losses).mean(0) if tag_losses else None,
            "gates": tuple(present("gates")) or None,
            "head_labels": tuple(present("head_labels")) or None,
            "phrase_states": torch.stack(phrase_states, dim=1) if phrase_states else None,
            "phrase_mask": phrase_masks[0] if phrase_masks else None,
        }


# The field of transformers' model outputs holding the decoder cache: `cache` from transformers 5.24 (where the old
# name still works but logs a deprecation warning), `past_key_values` before.
OUTPUT_CACHE_FIELD = "cache" if "cache" in {field.name for field in fields(Seq2SeqLMOutput)} else "past_key_values"


class MgsaDecoderKwargs(TransformersKwargs, total=False):
    """
    The keyword arguments of a decoder's forward: [`~transformers.utils.TransformersKwargs`] and what a variant's
    decoder layers read from the source besides its hidden states ([`MgsaEncoderOutput.source_memories`]).

    encoder_phrase_states (`torch.FloatTensor` of shape `(batch_size, encoder_layers + 1, num_phrases, d_model)`):
        PR: the source phrases of every encoder level.
    encoder_phrase_mask (`torch.BoolTensor` of shape `(batch_size, num_phrases)`):
        PR: `True` for real phrases.
    """

    encoder_phrase_states: torch.FloatTensor
    encoder_phrase_mask: torch.BoolTensor


@dataclass
class MgsaEncoderOutput(BaseModelOutput):
    r"""
    tag_loss (`torch.FloatTensor` of shape `(batch_size,)`, *optional*):
        MG-SA phrase-tag cross-entropy per sentence (Eq. 10: summed over its tagged phrases of every level; averaged
        over the supervised layers), when the model predicts tags and the batch carries `phrase_tags`. Per sentence so
        that it expands with beams.
    gates (`tuple(torch.FloatTensor)`, *optional*):
        Hybrid: per variant layer, the local/global gate `(batch_size, seq_len)` or `(batch_size, heads, seq_len)`.
    head_labels (`tuple(torch.LongTensor)`, *optional*):
        RHE: per variant layer, `(batch_size, heads)` with 1 for important and 0 for redundant heads.
    phrase_states (`torch.FloatTensor` of shape `(batch_size, encoder_layers + 1, num_phrases, d_model)`, *optional*):
        PR: the source phrase representations of the embeddings and of every encoder layer.
    phrase_mask (`torch.BoolTensor` of shape `(batch_size, num_phrases)`, *optional*):
        PR: `True` for real phrases.
    """

    tag_loss: torch.FloatTensor | None = None
    gates: tuple[torch.FloatTensor, ...] | None = None
    head_labels: tuple[torch.LongTensor, ...] | None = None
    phrase_states: torch.FloatTensor | None = None
    phrase_mask: torch.BoolTensor | None = None

    def source_memories(self) -> dict[str, torch.Tensor]:
        """What a variant's decoder layers read from the source besides its hidden states, as keyword arguments for
        the decoder (PR: `encoder_phrase_states`, `encoder_phrase_mask`); empty for the other variants."""
        if self.phrase_states is None:
            return {}
        return {"encoder_phrase_states": self.phrase_states, "encoder_phrase_mask": self.phrase_mask}


# the encoder's fields that the encoder-decoder outputs carry as `encoder_<field>`
SEQ2SEQ_ENCODER_FIELDS = ("tag_loss", "gates", "head_labels")


@dataclass
class MgsaSeq2SeqModelOutput(Seq2SeqModelOutput):
    r"""
    encoder_tag_loss, encoder_gates, encoder_head_labels:
        The encoder's [`MgsaEncoderOutput`] fields of the same names.
    """

    encoder_tag_loss: torch.FloatTensor | None = None
    encoder_gates: tuple[torch.FloatTensor, ...] | None = None
    encoder_head_labels: tuple[torch.LongTensor, ...] | None = None


@dataclass
class MgsaSeq2SeqLMOutput(Seq2SeqLMOutput):
    r"""
    translation_loss (`torch.FloatTensor`, *optional*):
        The cross-entropy of the labels alone (label-smoothed by `config.label_smoothing`); `loss` adds
        `phrase_tag_loss_weight * tag_loss` when there is one.
    tag_loss (`torch.FloatTensor`, *optional*):
        MG-SA phrase-tag loss of the batch (mean of the encoder's per-sentence `tag_loss`).
    encoder_gates, encoder_head_labels:
        See [`MgsaEncoderOutput`]; returned with `output_gates=True` / `output_head_labels=True`.
    """

    translation_loss: torch.FloatTensor | None = None
    tag_loss: torch.FloatTensor | None = None
    encoder_gates: tuple[torch.FloatTensor, ...] | None = None
    encoder_head_labels: tuple[torch.LongTensor, ...] | None = None


def encoder_output(hidden_states: torch.Tensor, layer_outputs: list[MgsaLayerOutput]) -> MgsaEncoderOutput:
    """The encoder output (either backbone): the last hidden states and what the layers contributed
    ([`MgsaLayerOutput.gather`])."""
    return MgsaEncoderOutput(last_hidden_state=hidden_states, **MgsaLayerOutput.gather(layer_outputs))
