"""What `chorus transcribe` is given to transcribe, as a list of clips in the input's order: audio
files (whatever soundfile reads), folders of them (searched recursively; the transcripts of a
LibriSpeech-layout folder's `*.trans.txt` become references), JSONL manifests (NeMo's
`audio_filepath`, with `text` as the reference where a line has one) and Lhotse CutSet manifests
(`*.jsonl.gz`: each cut's audio as Lhotse loads it, its supervisions' text the reference). Each clip's duration is
read from its header; a missing, unreadable, empty, too short or too long file, or a malformed
manifest line, is skipped and counted by reason in a `SkipReport`, as training counts them. With
`probe=False` no audio file is opened here (a clip's duration is None): whoever reads the audio
probes it (`jobs.transcription`'s transcriber), e.g. a pool of Ray actors, in parallel, where the files are.

Example:
    >>> clips, skipped = read_inputs(["corpus/test.jsonl", "more/"], max_seconds=60)  # doctest: +SKIP
    >>> clips[0].id, clips[0].duration, clips[0].reference  # doctest: +SKIP
    ('utt0001', 2.31, 'go left')
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from jobs.data.manifests import NOT_UTF8, SkipReport, probe_duration, read_jsonl, read_lines

AUDIO_SUFFIXES = {".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".aifc", ".au", ".snd",
                  ".caf", ".w64", ".rf64", ".sph", ".nist", ".voc"}  # what libsndfile reads


@dataclass(frozen=True)
class Clip:
    """One utterance to transcribe: its id (the file's stem), file, seconds, and transcript if known."""

    id: str
    path: Path
    duration: float | None  # None: not probed yet
    reference: str | None = None
    cut: dict | None = None  # a Lhotse cut's, where the input is a CutSet manifest (its audio loaded by Lhotse)


def read_inputs(inputs: list[str | Path], max_seconds: float = math.inf,
                probe: bool = True) -> tuple[list[Clip], SkipReport]:
    """The clips of `inputs` (files, folders, `.jsonl` manifests) in their order; those that
    cannot be transcribed are in the report instead (`probe=False`: only those a manifest
    line or a folder shows unusable; the audio files are not opened)."""
    report, clips = SkipReport(), []
    for source in map(Path, inputs):
        if source.is_dir():
            clips += _folder(source, report, max_seconds, probe)
        elif source.suffix == ".jsonl":
            clips += _manifest(source, report, max_seconds, probe)
        elif source.name.endswith(".jsonl.gz"):
            from jobs.data.lhotse_corpora import read_cutset

            clips += [Clip(u.id, u.path, u.duration, u.text or None, u.cut)
                      for u in read_cutset(source, report, max_seconds, need_text=False)]
        else:
            clips += _files([source], {}, report, max_seconds, probe)
    return clips, report


def _files(paths: list[Path], references: dict[str, str], report: SkipReport, max_seconds: float,
           probe: bool) -> list[Clip]:
    clips = []
    for path in paths:
        duration = probe_duration(path, str(path), report, max_seconds) if probe else None
        if duration is not None or not probe:
            clips.append(Clip(path.stem, path, duration, references.get(path.stem)))
    return clips


def _folder(root: Path, report: SkipReport, max_seconds: float, probe: bool) -> list[Clip]:
    references = {}
    for transcripts in sorted(root.rglob("*.trans.txt")):
        for line_no, line in read_lines(transcripts):
            if isinstance(line, bytes):
                report.skip(f"{transcripts}:{line_no}", NOT_UTF8)
                continue
            utt_id, _, text = line.strip().partition(" ")
            if utt_id and text.strip():
                references[utt_id] = text.strip().lower()
    audio = sorted(p for p in root.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
    return _files(audio, references, report, max_seconds, probe)


def _manifest(manifest: Path, report: SkipReport, max_seconds: float, probe: bool) -> list[Clip]:
    return [Clip(u.id, u.path, u.duration, u.text or None) for u in read_jsonl(manifest, report, max_seconds,
                                                                                 need_text=False, probe=probe)]
