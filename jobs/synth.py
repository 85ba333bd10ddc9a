"""Offline multi-voice speech corpus for tests, demos and benchmarks.

Speaks random 2-6-word sentences over a fixed 38-word command vocabulary with espeak-ng, loaded through
ctypes from the `espeakng-loader` wheel (no system package). Each utterance gets its own voice
variant, rate, pitch, leading/trailing silence and background noise at a random SNR, and is
resampled to 16 kHz mono FLAC. The corpus is described twice over the same FLAC files: as a
LibriSpeech-layout tree (`<split>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac` with
`<speaker>-<chapter>.trans.txt`, upper-case) and as NeMo-style JSONL manifests
(`<split>.jsonl`: `audio_filepath` relative to the manifest, `duration`, `text`).

Splits: `train`, `dev` and `test` use the training voices (dev and test with sentences not in
train); `test-unseen` uses voices never heard in training. Everything is a function of the seed.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio
from tqdm import tqdm

VOCABULARY = (
    "zero one two three four five six seven eight nine yes no up down left right on off stop go "
    "bed bird cat dog happy house tree wow forward backward follow learn visual open close start "
    "play pause"
).split()

# Voice = espeak-ng language + variant. Training voices and unseen voices share no variant.
TRAIN_VOICES = [
    "en-us+m1", "en-us+m3", "en-us+f1", "en-us+f3", "en+m2", "en+m4", "en+f2", "en+f4",
    "en-gb-scotland+m5", "en-gb-scotland+f5", "en-029+m6", "en-029+klatt",
    "en-gb-x-rp+m7", "en-gb-x-rp+klatt2", "en-us+klatt3", "en+david",
]
UNSEEN_VOICES = ["en-us+Andy", "en+iven", "en-gb-x-rp+Annie", "en-029+michel"]

SPLITS = ("train", "dev", "test", "test-unseen")
SAMPLE_RATE = 16_000

# espeak-ng's C API (speak_lib.h)
_AUDIO_OUTPUT_SYNCHRONOUS = 0x02
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_RATE, _PITCH = 1, 3
_EE_OK, _EE_NOT_FOUND = 0, 2
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class EspeakError(RuntimeError):
    pass


class Espeak:
    """espeak-ng in synchronous mode: text -> int16 waveform at the engine's rate (22,050 Hz).

    One per process: the library keeps global state."""

    def __init__(self):
        import espeakng_loader

        self._lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self._libc = ctypes.CDLL(None)
        self._libc.srand.argtypes = [ctypes.c_uint]
        self._lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        self._lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self._lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self._lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self._lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                           ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        rate = self._lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0,
                                           espeakng_loader.get_data_path().encode(), 0)
        if rate <= 0:
            raise EspeakError(f"espeak_Initialize failed ({rate}) with data at {espeakng_loader.get_data_path()}")
        self.sample_rate = rate
        self.data_path = Path(espeakng_loader.get_data_path())
        self._chunks: list[np.ndarray] = []
        self._callback = _SYNTH_CALLBACK(self._collect)  # kept alive on self
        self._lib.espeak_SetSynthCallback(self._callback)

    def _collect(self, wav, num_samples, _events) -> int:
        if num_samples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        return 0

    def has_voice(self, voice: str) -> bool:
        """espeak-ng knows the language and the variant (it silently ignores an unknown variant)."""
        language, _, variant = voice.partition("+")
        if variant and not (self.data_path / "voices" / "!v" / variant).is_file():
            return False
        return self._lib.espeak_SetVoiceByName(language.encode()) == _EE_OK

    def speak(self, text: str, voice: str, rate_wpm: int, pitch: int, noise_seed: int = 0) -> np.ndarray:
        err = self._lib.espeak_SetVoiceByName(voice.encode())
        if err != _EE_OK:
            reason = "not found" if err == _EE_NOT_FOUND else f"error {err}"
            raise EspeakError(f"espeak-ng voice {voice!r}: {reason}")
        for param, value in ((_RATE, rate_wpm), (_PITCH, pitch)):
            err = self._lib.espeak_SetParameter(param, value, 0)
            if err != _EE_OK:
                raise EspeakError(f"espeak_SetParameter({param}, {value}) failed with {err}")
        self._chunks = []
        # espeak-ng draws jitter from its own generator and Klatt noise from libc rand(): seed both
        # per utterance, so audio does not depend on what this process spoke before
        self._lib.espeak_ng_SetRandSeed(noise_seed)
        self._libc.srand(noise_seed)
        data = text.encode("utf-8") + b"\0"
        err = self._lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        if err != _EE_OK:
            raise EspeakError(f"espeak_Synth failed with {err} for {text!r}")
        if self._lib.espeak_Synchronize() != _EE_OK:
            raise EspeakError("espeak_Synchronize failed")
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)


@dataclass(frozen=True)
class UtterancePlan:
    split: str
    speaker: int
    chapter: int
    index: int
    voice: str
    text: str
    seed: int

    @property
    def utt_id(self) -> str:
        return f"{self.speaker}-{self.chapter}-{self.index:04d}"

    @property
    def relpath(self) -> str:
        return f"{self.split}/{self.speaker}/{self.chapter}/{self.utt_id}.flac"


def plan_corpus(utterances: int, eval_utterances: int, seed: int) -> list[UtterancePlan]:
    """Every utterance's split, voice and sentence, from the seed alone. Dev/test/test-unseen
    sentences never occur in train."""
    rng = np.random.default_rng(seed)
    seen: set[str] = set()

    def sentences(n: int, fresh: bool) -> list[str]:
        out = []
        while len(out) < n:
            s = " ".join(rng.choice(VOCABULARY, size=int(rng.integers(2, 7))))
            if fresh and s in seen:
                continue
            seen.add(s)
            out.append(s)
        return out

    counts = {"train": utterances, "dev": eval_utterances, "test": eval_utterances, "test-unseen": eval_utterances}
    plans = []
    for split_no, split in enumerate(SPLITS):
        voices = UNSEEN_VOICES if split == "test-unseen" else TRAIN_VOICES
        first_speaker = 1000 + (len(TRAIN_VOICES) if split == "test-unseen" else 0)
        per_speaker: dict[int, int] = {}
        for text in sentences(counts[split], fresh=split != "train"):
            v = int(rng.integers(len(voices)))
            speaker = first_speaker + v
            per_speaker[speaker] = per_speaker.get(speaker, 0) + 1
            plans.append(UtterancePlan(split, speaker, 10 * (split_no + 1), per_speaker[speaker] - 1,
                                       voices[v], text, int(rng.integers(2**31))))
    return plans


def render(engine: Espeak, plan: UtterancePlan) -> np.ndarray:
    """One utterance as float32 at 16 kHz: varied rate and pitch, padded with silence, noise added."""
    rng = np.random.default_rng(plan.seed)
    pcm = engine.speak(plan.text, plan.voice, rate_wpm=int(rng.integers(130, 211)), pitch=int(rng.integers(25, 76)),
                       noise_seed=plan.seed)
    if pcm.size == 0:
        raise EspeakError(f"espeak-ng produced no audio for {plan.utt_id} ({plan.text!r})")
    wav = torch.from_numpy(pcm.astype(np.float32) / 32768.0)
    wav = torchaudio.functional.resample(wav, engine.sample_rate, SAMPLE_RATE).numpy()
    pad = lambda: np.zeros(int(rng.uniform(0.05, 0.3) * SAMPLE_RATE), np.float32)  # noqa: E731
    wav = np.concatenate([pad(), wav, pad()])
    wav *= rng.uniform(0.3, 0.9) / max(1e-6, float(np.abs(wav).max()))
    snr_db = rng.uniform(15.0, 35.0)
    noise = rng.standard_normal(wav.size).astype(np.float32)
    noise *= np.sqrt(np.mean(wav**2) / 10 ** (snr_db / 10)) / max(1e-9, float(np.sqrt(np.mean(noise**2))))
    return np.clip(wav + noise, -1.0, 1.0)


CHUNK = 16  # utterances per worker task


def _write_chunk(job: tuple[list[UtterancePlan], str]) -> list[tuple[str, float]]:
    """Render a fixed chunk of consecutive utterances in a fresh process.

    espeak-ng keeps state between utterances that neither re-initialization nor its seeds reset,
    so each chunk gets a new process (the pool runs one task per child): the audio then depends
    only on the seed, not on the number of workers or on scheduling."""
    plans, out = job
    torch.set_num_threads(1)
    engine = Espeak()
    written = []
    for plan in plans:
        wav = render(engine, plan)
        path = Path(out) / plan.relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, wav, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
        written.append((plan.utt_id, len(wav) / SAMPLE_RATE))
    return written


def check_voices(voices: list[str]) -> None:
    """Fail early, naming every voice espeak-ng does not have."""
    engine = Espeak()
    missing = [v for v in voices if not engine.has_voice(v)]
    if missing:
        raise EspeakError(f"espeak-ng voices not found: {', '.join(missing)}")


def _pool_context():
    """Processes forked from a forkserver that has this module loaded: cheap to start, and safe
    in a caller that runs threads (a plain fork copies their locks mid-use: a child forked from a
    process with Ray's threads hung, and the pool with it)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def synthesize(out: str | Path, utterances: int = 2000, eval_utterances: int | None = None,
               seed: int = 0, workers: int | None = None, progress: bool = True) -> dict:
    """Write the corpus under `out`; returns a summary (counts and hours per split, voices).

    Example:
        >>> summary = synthesize("/tmp/corpus", utterances=40, eval_utterances=8, seed=1, progress=False)
        >>> summary["splits"]["train"]["utterances"]
        40
    """
    out = Path(out)
    eval_utterances = eval_utterances if eval_utterances is not None else max(20, utterances // 10)
    check_voices(TRAIN_VOICES + UNSEEN_VOICES)
    plans = plan_corpus(utterances, eval_utterances, seed)
    out.mkdir(parents=True, exist_ok=True)
    workers = workers or min(mp.cpu_count(), 8)
    durations: dict[str, float] = {}
    jobs = [(plans[i:i + CHUNK], str(out)) for i in range(0, len(plans), CHUNK)]
    with _pool_context().Pool(workers, maxtasksperchild=1) as pool, \
            tqdm(total=len(plans), desc=f"synth {out.name}", unit="utt", disable=not progress) as bar:
        for written in pool.imap_unordered(_write_chunk, jobs):
            durations.update(written)
            bar.update(len(written))
    return _write_indexes(out, plans, durations, seed)


def _write_indexes(out: Path, plans: list[UtterancePlan], durations: dict[str, float], seed: int) -> dict:
    summary = {"seed": seed, "sample_rate": SAMPLE_RATE, "splits": {},
               "voices": {"train": TRAIN_VOICES, "test-unseen": UNSEEN_VOICES}}
    for split in SPLITS:
        rows = [p for p in plans if p.split == split]
        transcripts: dict[Path, list[str]] = {}
        with open(out / f"{split}.jsonl", "w") as manifest:
            for p in rows:
                manifest.write(json.dumps({"audio_filepath": p.relpath, "duration": round(durations[p.utt_id], 4),
                                           "text": p.text}, allow_nan=False) + "\n")
                trans = out / split / str(p.speaker) / str(p.chapter) / f"{p.speaker}-{p.chapter}.trans.txt"
                transcripts.setdefault(trans, []).append(f"{p.utt_id} {p.text.upper()}")
        for trans, lines in transcripts.items():
            trans.write_text("\n".join(lines) + "\n")
        summary["splits"][split] = {"utterances": len(rows),
                                    "hours": round(sum(durations[p.utt_id] for p in rows) / 3600, 4)}
    (out / "corpus.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return summary
