"""The count of target tokens the training losses divide by, safe for a batch without any.

A batch whose `labels` are all -100 (every target truncated away, a filtered or empty target) has a loss sum of 0 over
0 tokens: a mean taken as 0 / 0 is NaN, and its gradient turns every weight NaN in one optimizer step, while the
Trainer logs the loss as 0. Here such a batch has the loss 0 and a zero gradient, as a sum over no tokens.
"""

import torch


def target_token_count(
    labels: torch.LongTensor, num_items_in_batch: torch.Tensor | int | None = None, device=None
) -> torch.Tensor:
    """
    The number of target tokens a loss is a mean over: those of `labels` (B, T) (-100 ignored), or
    `num_items_in_batch` (the Trainer's count over the whole accumulated batch) when given; a tensor on `device`.
    It may be 0: divide by [`at_least_one`] of it.
    """
    tokens = labels.ne(-100).sum() if num_items_in_batch is None else num_items_in_batch
    return torch.as_tensor(tokens, device=device if device is not None else labels.device)


def at_least_one(count: torch.Tensor) -> torch.Tensor:
    """`count`, or 1 where it is 0: a sum over no tokens (0) divided by it stays 0, with a zero gradient."""
    return count.clamp(min=1)


def per_target_token(total: torch.Tensor, labels: torch.LongTensor,
                     num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
    """`total` (a sum over the batch) over its target tokens ([`target_token_count`]); 0, with a zero gradient, when
    there are none, whatever `total` is (a source-side term such as MG-SA's tag loss is not kept without a target)."""
    tokens = target_token_count(labels, num_items_in_batch, total.device)
    return total * tokens.gt(0).to(total.dtype) / at_least_one(tokens).to(total.dtype)
