"""What a learner checks of a tensor another learner sent before it uses it: finite, and (weights)
of the same scale as its own. A tensor that fails is refused; the caller drops the link or skips
the update and counts a refusal (`channel.Refusals`), and the learner trains on.

One pass over the tensor: its norm is not finite if any element is NaN or infinite, and overflows
to infinity when the elements are absurdly large.
"""

from __future__ import annotations

import math

import torch

NORM_RATIO = 10.0  # a partner's weights are refused when their norm is over this times the receiver's:
# gossip partners hold replicas of one model a few exchanges apart (their norms differ by a few %)
NORM_FLOOR = 1.0  # ... or over NORM_RATIO x this, for a receiver whose own weights are near zero
GRAD_RATIO = 1e4  # an allreduce's mean gradient is refused when its norm is over this times the weights'
# (`allreduce.reasonable_update`): a catch for absurd values only; the optimizer clips the norm it applies


def finite(tensor: torch.Tensor) -> bool:
    """Whether every element is finite (and the sum of their squares does not overflow)."""
    return math.isfinite(float(torch.linalg.vector_norm(tensor)))


def received_weights(theirs: torch.Tensor, mine: torch.Tensor) -> bool:
    """Whether a partner's weights (or their public copy) may be averaged with this learner's
    `mine`: finite, with a norm at most NORM_RATIO times this learner's own."""
    norm = float(torch.linalg.vector_norm(theirs))
    return math.isfinite(norm) and norm <= NORM_RATIO * max(float(torch.linalg.vector_norm(mine)), NORM_FLOOR)
