"""The loss of the MGSA models: the label-smoothed translation loss plus MG-SA's phrase-tag loss (Hao et al., 2019,
Eq. 12), used by the models, `MgsaSeq2SeqTrainer` and the benchmark loop alike."""

from contextlib import contextmanager

import torch
from torch import nn
from transformers.utils import logging

from .target_tokens import at_least_one, per_target_token, target_token_count


logger = logging.get_logger(__name__)


def check_tag_supervision_inputs(model, labels, phrase_tags, encoder_outputs) -> None:
    """
    MG-SA's tag loss (Eq. 10) needs the batch's `phrase_tags` and a loss computed by the model: a training forward
    that runs the encoder with `labels` but no `phrase_tags` raises, and one without `labels` (a Trainer that
    computes the loss from the logits: `label_smoothing_factor`, `compute_loss_func`) warns once that the loss leaves
    the tag term out. Forwards in eval mode, or on given `encoder_outputs` (as in `generate`), need neither.
    """
    if not model.config.trains_tag_loss:
        return
    if not model.training or encoder_outputs is not None:
        return
    if labels is not None and phrase_tags is None:
        raise ValueError(
            "`phrase_tag_supervision=True` trains a tag classifier on the batch's `phrase_tags`, which this batch "
            "lacks. Make the batches with the processor of the model's `phrase_levels` (`MgsaProcessor(..., "
            "phrase_levels=config.phrase_levels)`, which returns `phrase_tags` beside `phrase_ids`) and batch them "
            "with `MgsaDataCollator`, or set `phrase_tag_supervision=False`."
        )
    if labels is None and not getattr(model, "tag_loss_added_by_caller", False):
        logger.warning_once(
            "`phrase_tag_supervision=True`, but the model is training without `labels`: the caller computes the "
            "loss from the logits (a Trainer with `label_smoothing_factor` > 0 or `compute_loss_func`), and that loss "
            "leaves out the tag loss (the classifier does not train). Train with `MgsaSeq2SeqTrainer`, which adds it "
            "back, or set the model's `label_smoothing` field instead of the Trainer's `label_smoothing_factor`."
        )


@contextmanager
def caller_adds_tag_loss(model, adds: bool = True):
    """
    Within it, a forward of `model` without `labels` does not warn that MG-SA's tag loss is left out (when `adds`):
    the caller adds the tag loss to the loss it computes from the logits. The flag is reset on leaving, error or not.
    """
    model.tag_loss_added_by_caller = adds
    try:
        yield
    finally:
        model.tag_loss_added_by_caller = False


def tag_loss_per_target_token(
    tag_loss: torch.Tensor, labels: torch.LongTensor, num_items_in_batch: torch.Tensor | int | None = None
) -> torch.Tensor:
    """
    MG-SA's tag loss on the scale of a translation loss that is a mean over target tokens. Eq. 12 of Hao et al.
    (2019) adds λ · L_tag to the translation log-likelihood, both summed per sentence; the translation loss here is
    that sum over the batch divided by its target tokens (`labels` (B, T), -100 ignored, or `num_items_in_batch`, the
    tokens of the whole accumulated batch), so the tag term is the batch's sum of sentence tag losses (`tag_loss`,
    their mean, times B) over the same count.
    """
    return per_target_token(tag_loss * labels.shape[0], labels, num_items_in_batch)  # 0 without target tokens


def translation_loss(
    logits: torch.Tensor,
    labels: torch.LongTensor,
    label_smoothing: float = 0.0,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """
    The cross-entropy of `logits` (B, T, V) against `labels` (B, T) (-100 ignored), label-smoothed by ε =
    `label_smoothing` as the Trainer's `LabelSmoother` does: (1 − ε) NLL + ε · mean_v(−log p_v) (Szegedy et al.,
    2016; Vaswani et al., 2017 §5.4). The mean over the target tokens, or, with `num_items_in_batch` (the Trainer's
    count of the target tokens of the whole accumulated batch), this batch's sum over that count.
    """
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, label_smoothing=label_smoothing,
        reduction="sum",
    )  # a batch without target tokens: 0 (a mean of no tokens would be NaN, and so would every gradient)
    return loss / at_least_one(target_token_count(labels, num_items_in_batch, loss.device)).to(loss.dtype)


def with_tag_loss(
    loss: torch.Tensor,
    tag_loss: torch.Tensor | None,
    weight: float,
    labels: torch.LongTensor,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """MG-SA's Eq. 12: the translation `loss` plus λ = `weight` times the batch's tag loss on its scale
    ([`tag_loss_per_target_token`]); `loss` itself without a tag loss. The models, `MgsaSeq2SeqTrainer` and the
    benchmark loop all add it here."""
    if tag_loss is None:
        return loss
    return loss + weight * tag_loss_per_target_token(tag_loss, labels, num_items_in_batch)
