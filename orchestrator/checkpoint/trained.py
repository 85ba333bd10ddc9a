"""A trained model out of a checkpoint, ready to use: `Recognizer.load(path)` reads a run's newest
usable checkpoint (or one checkpoint file) and returns its workload's recognizer (the registry's
`recognizer` part; for `asr`, `jobs.recognizer.SpeechRecognizer`), whose `transcribe` turns audio
into text. `from orchestrator import Recognizer` reaches it.

Example (`run`: a trained run's folder, `wav`: a file of speech):
    >>> recognizer = Recognizer.load(f"{run}/checkpoint.pt", decoding="greedy")
    >>> [type(text) for text in recognizer.transcribe([wav])]
    [<class 'str'>]
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.checkpoint.files import CheckpointError, load
from orchestrator.workload import workload_part


class Recognizer:
    """The entry to a checkpoint's trained model (`load`)."""

    @staticmethod
    def load(path: str | Path, decoding: str | None = None, warps: bool = True, device: str | None = None):
        """The recognizer of the checkpoint at `path` (a run folder or its `checkpoint.pt`: the newest
        usable one; any other file: that one), decoding as its spec says or by `decoding`
        (greedy, lexicon, lm), its test-time warps read unless `warps=False`, on `device` (a GPU
        when this process sees one). A CheckpointError says in one line why there is none."""
        state = load(path).state
        workload = state["spec"].get("workload", "asr")
        try:
            cls = workload_part(workload, "recognizer")
        except KeyError as exc:
            raise CheckpointError(f"{path}: {exc.args[0]}: its models cannot be loaded for use") from None
        try:
            return cls.from_checkpoint(state, decoding=decoding, warps=warps, device=device)
        except ValueError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
