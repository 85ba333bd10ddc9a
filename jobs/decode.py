"""Greedy CTC decoding: best class per frame, collapse repeats, drop blanks."""

from __future__ import annotations

import torch

from jobs.tokenizer import BLANK, BpeTokenizer, CharTokenizer


def greedy_decode(log_probs: torch.Tensor, lengths: torch.Tensor, tokenizer: CharTokenizer | BpeTokenizer) -> list[str]:
    """Decode a batch of CTC outputs.

    Args:
        log_probs: (batch, frames, classes) log-probabilities.
        lengths: (batch,) valid frames per utterance.
        tokenizer: maps the surviving ids back to text.
    """
    best = log_probs.argmax(dim=-1).cpu()
    texts = []
    for row, n in zip(best, lengths.cpu().tolist(), strict=True):
        row = torch.unique_consecutive(row[:n])
        texts.append(tokenizer.decode(row[row != BLANK].tolist()))
    return texts
