"""`chorus transcribe`'s work on the speech side: the clips its inputs name (`jobs.data.audio_inputs`)
and, for a batch of them, one record each — id, path, duration, text and the reference where the
input has one — or, for a clip whose audio proves unusable once probed or read, the reason it was
skipped (a clip listed but not probed, `read_inputs(probe=False)`, is probed here first).
The orchestrator runs it here or on Ray actors (the workload registry names it `asr`'s
`transcriber`); each actor builds one from the checkpoint once.

Example:
    >>> clips, skipped = ClipTranscriber.read_inputs(["corpus/test.jsonl"], state)  # doctest: +SKIP
    >>> ClipTranscriber.from_checkpoint(state)(clips[:2])  # doctest: +SKIP
    [{'id': 'utt0001', 'path': '...', 'duration': 2.31, 'text': 'go left', 'reference': 'go left'}, ...]
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

from jobs.data.audio_inputs import Clip, read_inputs
from jobs.data.lhotse_corpora import cut_audio
from jobs.data.manifests import AudioError, SkipReport, load_audio, probe_duration
from jobs.recognizer import SpeechRecognizer
from jobs.wer import word_error_rate


class ClipTranscriber:
    """A `SpeechRecognizer` over batches of clip records (dicts of a `Clip`'s fields): each comes back
    with its `text`, or with `skipped` (the reason) when its audio cannot be used."""

    def __init__(self, recognizer: SpeechRecognizer):
        self.recognizer = recognizer

    @classmethod
    def from_checkpoint(cls, state: dict, decoding: str | None = None, warps: bool = True,
                        device: str | None = None) -> ClipTranscriber:
        return cls(SpeechRecognizer.from_checkpoint(state, decoding=decoding, warps=warps, device=device))

    @staticmethod
    def read_inputs(inputs: list[str | Path], state: dict, probe: bool = True) -> tuple[list[dict], SkipReport]:
        """The clip records of `inputs` in their order, and what was skipped (utterances longer than the
        checkpoint's `data.max_utterance_seconds` among them). `probe=False`: the audio files are
        not opened here (durations None), but by the transcriber, which skips what the probe would."""
        max_seconds = state["spec"].get("data", {}).get("max_utterance_seconds", math.inf)
        clips, report = read_inputs(inputs, max_seconds, probe)
        return [record(clip) for clip in clips], report

    def __call__(self, clips: list[dict]) -> list[dict]:
        clips = [self._probed(clip) for clip in clips]
        out, readable, waveforms = list(clips), [], []
        for k, clip in enumerate(clips):
            if "skipped" in clip:  # by its header
                continue
            try:
                waveforms.append(cut_audio(clip["cut"], self.recognizer.max_seconds) if clip.get("cut")
                                 else load_audio(clip["path"], self.recognizer.max_seconds))
                readable.append(k)
            except AudioError as exc:
                out[k] = {**{key: v for key, v in clip.items() if key != "cut"}, "skipped": exc.reason,
                          "detail": exc.detail}
        texts = self.recognizer.transcribe_waveforms(waveforms, [clips[k]["duration"] for k in readable],
                                                     [clips[k]["id"] for k in readable])
        for k, text in zip(readable, texts, strict=True):
            fields = {key: value for key, value in clips[k].items() if key not in ("reference", "cut")}
            out[k] = fields | {"text": text} | ({"reference": clips[k]["reference"]} if "reference" in clips[k] else {})
        return out

    def _probed(self, clip: dict) -> dict:
        """`clip` with its duration (from its file's header where `read_inputs` did not probe), or
        skipped, for the reason `read_inputs` would have skipped it."""
        if clip["duration"] is not None:
            return clip
        report = SkipReport()
        duration = probe_duration(Path(clip["path"]), clip["path"], report, self.recognizer.max_seconds or math.inf)
        if duration is not None:
            return {**clip, "duration": duration}
        where, reason = report.items[0]
        return {**clip, "skipped": reason, "detail": where.removeprefix(clip["path"]).strip(" ()")}

    def totals(self, records: list[dict], skipped: dict[str, int], wall_s: float) -> dict:
        """`totals`, its WER over references and texts normalized as evaluation normalizes them."""
        return totals(records, skipped, wall_s, self.recognizer.workload.tokenizer.normalize)


def record(clip: Clip) -> dict:
    fields = {**asdict(clip), "path": str(clip.path.absolute())}  # (a Ray actor's working folder is not ours)
    return {key: value for key, value in fields.items() if value is not None or key not in ("reference", "cut")}


def totals(records: list[dict], skipped: dict[str, int], wall_s: float, normalize=str.lower) -> dict:
    """The last line of a transcription: utterances, audio hours, wall time, real-time factor
    (wall / audio seconds), skips by reason and, over the utterances with references, the WER
    (references `normalize`d, as a tokenizer normalizes the transcripts it trains on)."""
    audio_s = sum(r["duration"] for r in records)
    scored = [r for r in records if "reference" in r]
    return {"utterances": len(records), "audio_hours": audio_s / 3600, "wall_s": wall_s,
            "real_time_factor": wall_s / audio_s if audio_s else None,
            "utterances_per_s": len(records) / wall_s if wall_s else None,
            "skipped": dict(sorted(skipped.items())), "skipped_total": sum(skipped.values()),
            "wer": word_error_rate([normalize(r["reference"]) for r in scored], [r["text"] for r in scored])
            if scored else None,
            "scored_utterances": len(scored)}
