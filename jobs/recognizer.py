"""A trained speech model put to use: audio in (files, or arrays at any rate, stereo mixed down),
text out, decoded as its checkpoint says (or greedy, lexicon, lm). Utterances are batched as
evaluation batches them (by duration, then id, within the checkpoint's `data.max_batch_seconds`),
so a set transcribed together on the same device gives the texts `chorus eval` scores. (The
BiLSTM reads a batch padded, so the same utterance in another batch can come out a little
differently.) `chorus transcribe`, `orchestrator.Recognizer` and `chorus export` build on it.

Example (`state`: a checkpoint's, as `orchestrator.checkpoint.files.load` reads it):
    >>> recognizer = SpeechRecognizer.from_checkpoint(state, decoding="greedy")
    >>> texts = recognizer.transcribe([wav_path, (samples, 8000)])  # a file, and 8 kHz samples
    >>> [type(t) for t in texts]
    [<class 'str'>, <class 'str'>]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from jobs.data.batch import padded_batch
from jobs.data.manifests import SAMPLE_RATE, load_audio, mono_16k
from jobs.inference import chunks_by_budget, posteriors
from jobs.sections import WorkloadConfig
from jobs.workload import AsrWorkload

SPEC_SECTIONS = ("features", "model", "optim", "decoding")  # what of a checkpoint's spec shapes its model and decoding

Audio = str | Path | np.ndarray | torch.Tensor | tuple  # a file, 16 kHz samples, or (samples, rate)


class SpeechRecognizer:
    """A checkpoint's model, tokenizer, words and language model, ready to turn audio into text
    on `device`; `warps` are the VTLP factors each utterance is read at (None: once, unwarped)."""

    def __init__(self, workload: AsrWorkload, model: torch.nn.Module):
        self.workload, self.model = workload, model.eval()
        self.warps = workload.config.decoding.warps or [1.0]
        self.max_batch_seconds = workload.config.data.max_batch_seconds
        self.max_seconds = workload.config.data.max_utterance_seconds

    @classmethod
    def from_checkpoint(cls, state: dict, decoding: str | None = None, warps: bool = True,
                        device: str | torch.device | None = None) -> SpeechRecognizer:
        """The model a checkpoint holds, decoded as its spec says, or by `decoding` (greedy,
        lexicon, lm); `warps=False` reads each utterance once, whatever `decoding.warps` says.
        `device`: cuda when this process sees a GPU, else cpu. A ValueError names what a
        decoding needs that the checkpoint lacks (lm without a language model)."""
        spec = state["spec"]
        raw = {k: spec[k] for k in SPEC_SECTIONS if k in spec}
        raw["decoding"] = {**raw.get("decoding", {}), **({"kind": decoding} if decoding else {}),
                           **({} if warps else {"warps": None})}
        data = spec.get("data", {})
        raw["data"] = {key: data[key] for key in ("train", "max_batch_seconds", "max_utterance_seconds") if key in data}
        lm = raw["decoding"].get("lm")
        if raw["decoding"].get("kind") == "lm" and "lm_arpa" not in state and not (lm and Path(lm).is_file()):
            raise ValueError("lm decoding: this checkpoint carries no language model (it was not trained with "
                             "decoding.kind: lm) and its decoding.lm names no file here")
        config = WorkloadConfig.model_validate(raw, context={"check_paths": False})  # another machine's paths
        train = config.data.train
        if config.decoding.uses_lexicon and "lexicon" not in state and "://" not in str(train) and \
                not Path(train).exists():
            raise ValueError(f"{config.decoding.kind} decoding: this checkpoint carries no words (it was trained "
                             f"decoding greedy), and its training data {train} is not here to take them from")
        workload = AsrWorkload(config)
        model = workload.build_model()
        workload.load_state_dict(state, model)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        return cls(workload, model.to(device))

    def transcribe(self, audio: Sequence[Audio], sample_rate: int = SAMPLE_RATE) -> list[str]:
        """One text per item of `audio`: a file soundfile reads, an array of samples at
        `sample_rate` ((frames,) or (frames, channels)), or a (samples, rate) pair. An unusable
        item is a `jobs.data.manifests.AudioError` naming why."""
        waveforms = []
        for item in audio:
            if isinstance(item, str | Path):
                waveforms.append(load_audio(item, self.max_seconds))
            else:
                samples, rate = item if isinstance(item, tuple) else (item, sample_rate)
                samples = samples.numpy() if isinstance(samples, torch.Tensor) else samples
                waveforms.append(mono_16k(samples, int(rate)))
        return self.transcribe_waveforms(waveforms)

    @torch.no_grad()
    def transcribe_waveforms(self, waveforms: Sequence[torch.Tensor], durations: Sequence[float] | None = None,
                             keys: Sequence[str] | None = None) -> list[str]:
        """The texts of 16 kHz mono waveforms, in their order, batched as evaluation batches:
        sorted by (`durations`, `keys`) (default: their lengths, their order) and cut by
        `data.max_batch_seconds`."""
        durations = list(durations) if durations is not None else [len(w) / SAMPLE_RATE for w in waveforms]
        keys = list(keys) if keys is not None else [f"{i:012d}" for i in range(len(waveforms))]
        order = sorted(range(len(waveforms)), key=lambda i: (durations[i], keys[i]))
        texts: list[str | None] = [None] * len(waveforms)
        for chunk in chunks_by_budget(order, durations, self.max_batch_seconds):
            readings = [self._batch([self.workload.fbank(waveforms[i], warp=warp) for i in chunk])
                        for warp in self.warps]
            _, log_probs, lengths = posteriors(self.model, readings, self.workload.autocast)
            for i, text in zip(chunk, self.workload.decode(log_probs, lengths), strict=True):
                texts[i] = text
        return texts

    def _batch(self, feats: list[torch.Tensor]):
        return padded_batch(feats, [""] * len(feats), [str(i) for i in range(len(feats))], self.workload.tokenizer)
