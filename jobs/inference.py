"""What evaluating and transcribing share: a model's log-posteriors for a batch read at one or
more VTLP warps (test-time augmentation: the readings' probabilities averaged), and the batches
that order and a padded-seconds budget cut a list of utterances into."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from jobs.data.batch import Batch


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def posteriors(model: torch.nn.Module, readings: list[Batch],
               autocast: Callable[[torch.nn.Module], torch.autocast]) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """One batch's `readings` (the same utterances, in the same order, read at each warp) on the
    model's device, the model's (batch, frames, classes) log-posteriors, their probabilities
    averaged over the readings (a warp keeps the frames), and the valid frames; with the first
    reading as the batch."""
    readings, outputs = [b.to(device_of(model)) for b in readings], []
    for warped in readings:
        with autocast(model):
            log_probs, lengths = model(warped.feats, warped.feat_lengths)
        outputs.append(log_probs.float())
    if len(outputs) == 1:
        return readings[0], outputs[0], lengths
    return readings[0], torch.logsumexp(torch.stack(outputs), dim=0) - math.log(len(outputs)), lengths


def chunks_by_budget(order: list[int], durations: list[float], budget: float) -> Iterator[list[int]]:
    """`order`'s indices in runs whose padded seconds (count x the last one's duration, `order`
    being by duration) stay within `budget` (a run holds one utterance at least)."""
    chunk: list[int] = []
    for i in order:
        if chunk and (len(chunk) + 1) * durations[i] > budget:
            yield chunk
            chunk = []
        chunk.append(i)
    if chunk:
        yield chunk
