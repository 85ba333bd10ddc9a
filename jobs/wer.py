"""Word and character error rates through jiwer, as percentages."""

from __future__ import annotations

import jiwer


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Corpus-level WER in percent (errors over reference words, times 100).

    An empty hypothesis counts every reference word as deleted. Example:
        >>> word_error_rate(["go left", "stop"], ["go right", "stop"])
        33.33333333333333
    """
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    if not references:
        return 0.0
    refs = [r if r.strip() else "<empty>" for r in references]
    return 100.0 * jiwer.wer(refs, list(hypotheses))


def character_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Corpus-level CER in percent (character edits over reference characters, spaces included).

    Example:
        >>> round(character_error_rate(["go left"], ["go lift"]), 2)
        14.29
    """
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    if not references:
        return 0.0
    refs = [r if r.strip() else "<empty>" for r in references]
    return 100.0 * jiwer.cer(refs, list(hypotheses))
