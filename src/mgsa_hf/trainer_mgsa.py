"""`Seq2SeqTrainer` that keeps the model's auxiliary losses.

`Seq2SeqTrainer` computes the translation loss itself when `label_smoothing_factor > 0` (its `LabelSmoother`) or when
a `compute_loss_func` is given, from the logits alone: the model's own `loss`, which holds MG-SA's phrase-tag term
λ·L_tag (Hao et al., 2019, Eq. 10; λ = `phrase_tag_loss_weight`), is then dropped and the tag classifier never
trains. [`MgsaSeq2SeqTrainer`] adds the term back in exactly those cases and logs the tag loss on its own.
"""

from transformers import Seq2SeqTrainer


class MgsaSeq2SeqTrainer(Seq2SeqTrainer):
    """
    [`~transformers.Seq2SeqTrainer`] for MGSA models: the training loss is the Trainer's translation loss (label
    smoothed or not) plus `phrase_tag_loss_weight` × the model's `tag_loss` (MG-SA Eq. 10) whenever the model
    returns one; the mean tag loss since the last log is logged as `tag_loss`. Models without auxiliary losses train
    exactly as under `Seq2SeqTrainer`.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tag_loss_total = None
        self._tag_loss_count = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # the Trainer recomputes the loss from the logits in these two cases, leaving the model's own loss aside
        recomputed = (self.label_smoother is not None or self.compute_loss_func is not None) and "labels" in inputs
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        tag_loss = outputs.get("tag_loss") if isinstance(outputs, dict) else None
        if tag_loss is not None:
            if recomputed:
                weight = self.accelerator.unwrap_model(model).config.phrase_tag_loss_weight
                auxiliary = weight * tag_loss.to(loss.dtype)
                if self._translation_loss_scaled_for_accumulation(num_items_in_batch):
                    # the translation loss is already a share of the accumulated batch; the tag loss is a
                    # per-batch mean, so it takes its share here rather than in `training_step`
                    auxiliary = auxiliary / self._accumulation_steps()
                loss = loss + auxiliary
            if model.training:
                detached = tag_loss.detach().float()
                self._tag_loss_total = detached if self._tag_loss_total is None else self._tag_loss_total + detached
                self._tag_loss_count += 1
        return (loss, outputs) if return_outputs else loss

    def _accumulation_steps(self) -> int:
        return getattr(self, "current_gradient_accumulation_steps", None) or self.args.gradient_accumulation_steps

    def _translation_loss_scaled_for_accumulation(self, num_items_in_batch) -> bool:
        """Mirrors `Trainer.training_step`: whether the loss it is given is already normalised over the whole
        accumulated batch (then it is not divided by the accumulation steps)."""
        scaled = getattr(self, "loss_is_scaled_for_ga", None)
        if scaled is not None:
            return bool(scaled)
        return bool(self.model_accepts_loss_kwargs and num_items_in_batch is not None) or \
            self.compute_loss_func is not None

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if self._tag_loss_count and "loss" in logs:  # training logs only, not evaluation ones
            total = self._tag_loss_total
            if self.args.world_size > 1:
                total = self.accelerator.reduce(total.to(self.args.device), reduction="mean")
            logs["tag_loss"] = round(float(total) / self._tag_loss_count, 4)
            self._tag_loss_total, self._tag_loss_count = None, 0
        super().log(logs, *args, **kwargs)


__all__ = ["MgsaSeq2SeqTrainer"]
