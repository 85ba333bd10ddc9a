"""Offline multi-voice, multi-engine speech corpus for tests, demos and benchmarks.

Speaks one of two tasks: `commands`, random 2-6-word sentences over a fixed 38-word command
vocabulary, or `openvocab`, sentences of real English from Debian's `fortunes` quotations
(`jobs/synth/open_text.py`: an open vocabulary, numbers spelled out, a share of test words never in
training text), as many as `--hours` of training speech asks. Two engines speak:
espeak-ng (formant synthesis), loaded through ctypes from the `espeakng-loader` wheel, and, where
Debian's `festival` and its English voices are installed (`make test-deps`), Festival: two diphone
voices in training and its HTS voice (statistical parametric synthesis) kept for its own split.
Each utterance gets its own voice, speaking rate, pitch, volume, leading/trailing silence and
background noise at a random SNR, and is resampled from the engine's rate to 16 kHz mono FLAC.
The corpus is described twice over the same FLAC files: as a LibriSpeech-layout tree
(`<split>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac` with `<speaker>-<chapter>.trans.txt`,
upper-case) and as NeMo-style JSONL manifests (`<split>.jsonl`: `audio_filepath` relative to the
manifest, `duration`, `text`).

Splits: `train`, `dev` and `test` use the training voices (dev and test with sentences not in
train); `test-unseen` uses espeak-ng voices never heard in training; `test-unseen-engine` (with
Festival only) a synthesizer never heard in training. With `engines="espeak,festival,flite"`, CMU's
flite speaks too: two of its clustergen voices (statistical parametric synthesis like HTS's, by
another engine and other speakers than the held-out one) join the training voices. With
`engines="espeak,festival,flite,world"`, those four male Festival and flite voices are also heard
converted by the WORLD vocoder (`jobs/synth/voice_conversion.py`: pitch and formants raised, envelope
smoothed) as four more training voices ("world:<voice>"). Everything is a function of the seed and
of the engines used (`corpus.json` names them).
"""

from __future__ import annotations

import ctypes
import functools
import json
import multiprocessing as mp
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio
from tqdm import tqdm

from jobs.synth import open_text, voice_conversion
from jobs.synth.open_text import TextSplit

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
# Festival's voices ("festival:<name>"): diphone concatenation in training; its HMM-based (HTS) voice,
# a kind of synthesizer never heard in training, is the unseen-engine split's only voice
FESTIVAL_TRAIN_VOICES = ["festival:kal_diphone", "festival:ked_diphone"]
UNSEEN_ENGINE_VOICES = ["festival:cmu_us_slt_arctic_hts"]
FESTIVAL_SHARE = 0.3  # of the training splits' utterances, spoken by Festival when it is there
FESTIVAL_PACKAGES = "festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts"
# flite's voices ("flite:<name>"), only when asked for: its clustergen voices of speakers other than
# the held-out HTS voice's (flite's slt is that speaker; its kal16 is Festival's kal)
FLITE_TRAIN_VOICES = ["flite:awb", "flite:rms"]
FLITE_SHARE = 0.15  # more of the training splits' utterances spoken by another engine than espeak-ng
FLITE_PACKAGES = "flite"
# the other engines' (male) training voices, converted by the WORLD vocoder ("world:<voice>"), only when asked for
WORLD_TRAIN_VOICES = [f"world:{voice}" for voice in FESTIVAL_TRAIN_VOICES + FLITE_TRAIN_VOICES]
WORLD_SHARE = 0.15  # more of the training splits' utterances spoken by another engine than espeak-ng

SPLITS = ("train", "dev", "test", "test-unseen", "test-unseen-engine")
SAMPLE_RATE = 16_000

# espeak-ng's C API (speak_lib.h)
_AUDIO_OUTPUT_SYNCHRONOUS = 0x02
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_RATE, _PITCH = 1, 3
_EE_OK, _EE_NOT_FOUND = 0, 2
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class SynthError(RuntimeError):
    pass


class EspeakError(SynthError):
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


class Festival:
    """Festival's `festival --pipe`: a list of utterances synthesized by one process, each written to
    a RIFF file in a temporary folder and read back (int16 at the voice's own rate: 16 kHz for the
    diphone voices, 32 kHz for HTS). Its speaking rate is `Parameter Duration_Stretch`; pitch is
    shifted afterwards (`render`), the same way for every voice."""

    @staticmethod
    @functools.cache  # a Festival process asked once (0.35 s), not at every check
    def voices() -> frozenset[str]:
        """The installed Festival voices ("festival:<name>"); none when Festival is not installed."""
        if shutil.which("festival") is None:
            return frozenset()
        proc = subprocess.run(["festival", "--pipe"], input="(print (voice.list))\n", capture_output=True,
                              text=True, timeout=60)
        names = proc.stdout.strip().strip("()").split()
        return frozenset(f"festival:{name}" for name in names) if proc.returncode == 0 else frozenset()

    @staticmethod
    def speak_all(items: list[tuple[str, str, str, float]]) -> dict[str, tuple[np.ndarray, int]]:
        """(key, text, voice, duration stretch) -> {key: (int16 waveform, its sample rate)}."""
        if not items:
            return {}
        with tempfile.TemporaryDirectory(prefix="chorus-festival-") as tmp:
            script = []
            for n, (_key, text, voice, stretch) in enumerate(items):
                quoted = text.replace("\\", " ").replace('"', " ")
                script += [f"(voice_{voice.removeprefix('festival:')})",
                           f"(Parameter.set 'Duration_Stretch {stretch:.4f})",
                           f'(utt.save.wave (utt.synth (Utterance Text "{quoted}")) "{tmp}/{n}.wav" \'riff)']
            proc = subprocess.run(["festival", "--pipe"], input="\n".join(script) + "\n", capture_output=True,
                                  text=True, timeout=60 + 5 * len(items))
            return {key: _read_riff(Path(tmp) / f"{n}.wav", proc, f"festival produced no audio for {key} "
                                    f"({text!r}, {voice})") for n, (key, text, voice, _stretch) in enumerate(items)}


class Flite:
    """CMU's flite, a process per utterance writing a RIFF file (int16 at 16 kHz) read back. Its
    speaking rate is `duration_stretch`, as Festival's; pitch is shifted afterwards (`render`)."""

    @staticmethod
    @functools.cache
    def voices() -> frozenset[str]:
        """The voices flite has built in ("flite:<name>"); none when flite is not installed."""
        if shutil.which("flite") is None:
            return frozenset()
        proc = subprocess.run(["flite", "-lv"], capture_output=True, text=True, timeout=60)
        return frozenset(f"flite:{n}" for n in proc.stdout.partition(":")[2].split()) if proc.returncode == 0 \
            else frozenset()

    @staticmethod
    def speak_all(items: list[tuple[str, str, str, float]]) -> dict[str, tuple[np.ndarray, int]]:
        """(key, text, voice, duration stretch) -> {key: (int16 waveform, its sample rate)}."""
        out = {}
        with tempfile.TemporaryDirectory(prefix="chorus-flite-") as tmp:
            for n, (key, text, voice, stretch) in enumerate(items):
                path = Path(tmp) / f"{n}.wav"
                proc = subprocess.run(["flite", "-voice", voice.removeprefix("flite:"), "--setf",
                                       f"duration_stretch={stretch:.4f}", "-t", text, "-o", str(path)],
                                      capture_output=True, text=True, timeout=60)
                out[key] = _read_riff(path, proc, f"flite produced no audio for {key} ({text!r}, {voice})")
        return out


def _read_riff(path: Path, proc: subprocess.CompletedProcess, failed: str) -> tuple[np.ndarray, int]:
    """A synthesizer's RIFF file read back: (int16 waveform, its sample rate); `failed` and the
    process's last words when it wrote none or only a header."""
    if not path.is_file() or path.stat().st_size <= 44:
        raise SynthError(f"{failed}: {proc.stderr.strip()[-300:] or f'exit {proc.returncode}'}")
    wav, rate = sf.read(str(path), dtype="int16")
    return wav if wav.ndim == 1 else wav[:, 0], rate


EXTERNAL_ENGINES = {"festival:": Festival, "flite:": Flite}  # voice prefix -> engine run as a process


def is_festival(voice: str) -> bool:
    return voice.startswith("festival:")


def is_external(voice: str) -> bool:
    """Spoken by a process of its own (Festival, flite; converted or not), not by espeak-ng in this one."""
    return base_voice(voice).startswith(tuple(EXTERNAL_ENGINES))


def base_voice(voice: str) -> str:
    """The voice that speaks a "world:<voice>" before its conversion (any other voice: itself)."""
    return voice.removeprefix("world:")


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


def plan_corpus(utterances: int, eval_utterances: int, seed: int, festival: bool = False,
                text: TextSplit | None = None, flite: bool = False, world: bool = False) -> list[UtterancePlan]:
    """Every utterance's split, voice and sentence, from the seed (and whether Festival, and with
    it flite, and with that WORLD's conversions, speak) alone. Sentences of the evaluation splits
    never occur in train. Without Festival there is no `test-unseen-engine` split, and the plan is
    the one espeak-ng alone always had. With `text` (the `openvocab` task) the sentences are its
    own: train's in an order shuffled by the seed, again in a new order when there are more
    utterances than sentences (each time another voice and prosody), dev's and test's in order
    (every test-like split speaks the test sentences)."""
    rng = np.random.default_rng(seed)
    seen: set[str] = set()

    def sentences(split: str, n: int) -> list[str]:
        if text is not None:
            return _open_sentences(text, split if split in {"train", "dev"} else "test", n, rng)
        fresh, out = split != "train", []
        while len(out) < n:
            s = " ".join(rng.choice(VOCABULARY, size=int(rng.integers(2, 7))))
            if fresh and s in seen:
                continue
            seen.add(s)
            out.append(s)
        return out

    splits = SPLITS if festival else SPLITS[:-1]
    counts = {split: utterances if split == "train" else eval_utterances for split in splits}
    others = FESTIVAL_TRAIN_VOICES + (FLITE_TRAIN_VOICES if flite else []) + (WORLD_TRAIN_VOICES if world else [])
    train_voices = TRAIN_VOICES + (others if festival else [])  # others: spoken by other engines
    share = FESTIVAL_SHARE + (FLITE_SHARE if flite else 0.0) + (WORLD_SHARE if world else 0.0)
    voices_of = {"test-unseen": UNSEEN_VOICES, "test-unseen-engine": UNSEEN_ENGINE_VOICES}
    first_speakers = {"test-unseen": 1000 + len(train_voices),
                      "test-unseen-engine": 1000 + len(train_voices) + len(UNSEEN_VOICES)}
    plans = []
    for split_no, split in enumerate(splits):
        voices = voices_of.get(split, train_voices)
        first_speaker = first_speakers.get(split, 1000)
        per_speaker: dict[int, int] = {}
        for sentence in sentences(split, counts[split]):
            if festival and voices is train_voices:  # `share` of these utterances are the other engines'
                pick = rng.random() < share
                v = (len(TRAIN_VOICES) + int(rng.integers(len(others))) if pick
                     else int(rng.integers(len(TRAIN_VOICES))))
            else:
                v = int(rng.integers(len(voices)))
            speaker = first_speaker + v
            per_speaker[speaker] = per_speaker.get(speaker, 0) + 1
            plans.append(UtterancePlan(split, speaker, 10 * (split_no + 1), per_speaker[speaker] - 1,
                                       voices[v], sentence, int(rng.integers(2**31))))
    return plans


def _open_sentences(text: TextSplit, split: str, n: int, rng: np.random.Generator) -> list[str]:
    """`n` sentences of `text`'s `split`: train's shuffled, round after round; dev's and test's
    the first `n` (an error if it has fewer)."""
    pool = getattr(text, split)
    if split != "train":
        if n > len(pool):
            raise SynthError(f"{split}: {n} utterances asked, the text has {len(pool)} {split} sentences")
        return pool[:n]
    rounds = [pool[i] for _ in range(-(-n // len(pool))) for i in rng.permutation(len(pool))]
    return rounds[:n]


def _prosody(plan: UtterancePlan) -> tuple[np.random.Generator, int, int]:
    """The utterance's generator, after drawing its speaking rate (words a minute, 130-210) and
    pitch (espeak-ng's 0-100 scale, 25-75; 50 is the voice's own)."""
    rng = np.random.default_rng(plan.seed)
    return rng, int(rng.integers(130, 211)), int(rng.integers(25, 76))


def festival_pitch(pitch: int) -> Fraction:
    """How much a Festival voice's pitch is raised, from the drawn pitch (25-75): in quarter tones,
    25 -> -2 semitones, 75 -> +2, as a ratio of small integers. The audio is resampled as if it had
    been recorded at that much higher a rate, which moves pitch and formants together (as speed
    perturbation does) and costs a small polyphase filter; a phase vocoder's shift resampled between
    coprime rates and took ~3 s an utterance."""
    return Fraction(2 ** (round((pitch - 50) / 6.25) / 24)).limit_denominator(64)


def festival_stretch(rate_wpm: int, pitch: int) -> float:
    """Festival's Duration_Stretch (and flite's duration_stretch) for a speaking rate (1 at 170 words
    a minute, the range's middle), lengthened by the pitch ratio that `render`'s resampling will
    shorten it by."""
    return 170 / rate_wpm * float(festival_pitch(pitch))


def render(engine: Espeak | None, plan: UtterancePlan, external: tuple[np.ndarray, int] | None = None) -> np.ndarray:
    """One utterance as float32 at 16 kHz: varied rate and pitch, padded with silence, scaled, noise
    added. An espeak-ng voice is spoken by `engine`; a Festival or flite voice's audio comes in as
    `external` (`speak_all`, at the rate `_prosody` drew), and its pitch is raised or lowered here
    (`festival_pitch`)."""
    rng, rate_wpm, pitch = _prosody(plan)
    if external is None:
        pcm, rate = engine.speak(plan.text, plan.voice, rate_wpm=rate_wpm, pitch=pitch, noise_seed=plan.seed), \
            engine.sample_rate
    else:
        pcm, rate = external
    if pcm.size == 0:
        raise SynthError(f"{plan.voice} produced no audio for {plan.utt_id} ({plan.text!r})")
    shift = festival_pitch(pitch) if external is not None else Fraction(1)
    wav = torchaudio.functional.resample(torch.from_numpy(pcm.astype(np.float32) / 32768.0),
                                         rate * shift.numerator, SAMPLE_RATE * shift.denominator).numpy()
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
    external = {}
    for prefix, spoken_by in EXTERNAL_ENGINES.items():
        external |= spoken_by.speak_all([(p.utt_id, p.text, base_voice(p.voice), festival_stretch(*_prosody(p)[1:]))
                                         for p in plans if base_voice(p.voice).startswith(prefix)])
    for plan in plans:
        if plan.voice != base_voice(plan.voice):
            pcm, rate = external[plan.utt_id]
            converted = voice_conversion.convert(pcm, rate, seed=plan.seed + 1)  # + 1: not the prosody's draws
            external[plan.utt_id] = (np.clip(converted * 32768.0, -32768, 32767).astype(np.int16), rate)
    engine = Espeak() if any(not is_external(p.voice) for p in plans) else None
    written = []
    for plan in plans:
        wav = render(engine, plan, external.get(plan.utt_id))
        path = Path(out) / plan.relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, wav, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
        written.append((plan.utt_id, len(wav) / SAMPLE_RATE))
    return written


def check_voices(voices: list[str]) -> None:
    """Fail early, naming every voice its engine does not have."""
    engine, known = Espeak(), {v for prefix, spoken_by in EXTERNAL_ENGINES.items()
                               if any(base_voice(v).startswith(prefix) for v in voices) for v in spoken_by.voices()}
    missing = [v for v in voices if not (base_voice(v) in known if is_external(v) else engine.has_voice(v))]
    if any(v != base_voice(v) for v in voices):
        try:
            voice_conversion.pyworld()  # an error now, naming what is missing, not in every worker
        except voice_conversion.VoiceConversionError as exc:
            raise SynthError(str(exc)) from None
    if missing:
        raise SynthError(f"voices not found: {', '.join(missing)}")


def use_festival(engines: str) -> bool:
    """Whether Festival speaks: `engines` is "espeak", "espeak,festival" or "espeak,festival,flite"
    (an error without it) or "auto" (Festival when all its voices are installed; otherwise a message
    says what is missing)."""
    if engines not in ENGINE_CHOICES:
        raise SynthError(f"engines: expected one of {', '.join(ENGINE_CHOICES)}, got {engines!r}")
    if engines == "espeak":
        return False
    missing = sorted(set(FESTIVAL_TRAIN_VOICES + UNSEEN_ENGINE_VOICES) - Festival.voices())
    if missing and engines == "auto":
        print(f"chorus synth: Festival voices not installed ({', '.join(missing)}): espeak-ng only, no "
              f"test-unseen-engine split (Debian: apt-get install {FESTIVAL_PACKAGES})", file=sys.stderr)
    elif missing:
        raise SynthError(f"Festival voices not installed: {', '.join(missing)} (apt-get install {FESTIVAL_PACKAGES})")
    return not missing


def use_flite(engines: str) -> bool:
    """Whether flite speaks too: only when `engines` names it (an error when it is not installed)."""
    if "flite" not in engines.split(","):
        return False
    missing = sorted(set(FLITE_TRAIN_VOICES) - Flite.voices())
    if missing:
        raise SynthError(f"flite voices not installed: {', '.join(missing)} (apt-get install {FLITE_PACKAGES})")
    return True


ENGINE_CHOICES = ("auto", "espeak", "espeak,festival", "espeak,festival,flite", "espeak,festival,flite,world")


def use_world(engines: str) -> bool:
    """Whether the WORLD vocoder's conversions of Festival's and flite's voices speak too."""
    return "world" in engines.split(",")


def _pool_context():
    """Processes forked from a forkserver that has this module loaded: cheap to start, and safe
    in a caller that runs threads (a plain fork copies their locks mid-use: a child forked from a
    process with Ray's threads hung, and the pool with it)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def synthesize(out: str | Path, utterances: int = 2000, eval_utterances: int | None = None,
               seed: int = 0, workers: int | None = None, progress: bool = True, engines: str = "auto",
               task: str = "commands", hours: float | None = None, oov_share: float = 0.02) -> dict:
    """Write the corpus under `out`; returns a summary (counts and hours per split, engines,
    voices; for `openvocab`, the test's out-of-vocabulary rate). `engines`: see `use_festival`
    and `use_flite`.
    `task`: `commands` or `openvocab` (`jobs/synth/open_text.py`; `oov_share` of its test words held
    out of training text); `hours`: as many training utterances as make about that much speech
    (instead of `utterances`).

    Example:
        >>> summary = synthesize("/tmp/corpus", utterances=40, eval_utterances=8, seed=1, progress=False)
        >>> summary["splits"]["train"]["utterances"]
        40
    """
    out = Path(out)
    if task not in TASKS:
        raise SynthError(f"task: expected one of {', '.join(TASKS)}, got {task!r}")
    text = _open_text(eval_utterances or OPEN_EVAL_UTTERANCES, seed, oov_share) if task == "openvocab" else None
    if hours is not None:
        utterances = utterances_for_hours(hours, text)
    eval_utterances = eval_utterances if eval_utterances is not None else (
        OPEN_EVAL_UTTERANCES if text is not None else max(20, utterances // 10))
    festival = use_festival(engines)
    flite = festival and use_flite(engines)
    plans = plan_corpus(utterances, eval_utterances, seed, festival, text, flite=flite,
                        world=flite and use_world(engines))
    check_voices(sorted({p.voice for p in plans}))
    out.mkdir(parents=True, exist_ok=True)
    workers = workers or min(mp.cpu_count(), 8)
    durations: dict[str, float] = {}
    jobs = [(plans[i:i + CHUNK], str(out)) for i in range(0, len(plans), CHUNK)]
    with _pool_context().Pool(workers, maxtasksperchild=1) as pool, \
            tqdm(total=len(plans), desc=f"synth {out.name}", unit="utt", disable=not progress) as bar:
        for written in pool.imap_unordered(_write_chunk, jobs):
            durations.update(written)
            bar.update(len(written))
    summary = _write_indexes(out, plans, durations, seed)
    if text is not None:
        summary |= {"task": task, "oov_rate_test": round(text.oov_rate(), 4), "held_out_words": len(text.held_out),
                    "train_sentences": len(text.train)}
        (out / "corpus.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return summary


TASKS = ("commands", "openvocab")
OPEN_EVAL_UTTERANCES = 400  # sentences in dev and in test of the openvocab task (each test-like split speaks test's)
SECONDS_PER_WORD = 0.30  # spoken, with engines and rates as drawn (openvocab, seed 0: 200 utterances, 0.198 h)
PAD_SECONDS = 0.35  # the mean of `render`'s silences, both ends


def _open_text(eval_sentences: int, seed: int, oov_share: float) -> TextSplit:
    try:
        return open_text.split_sentences(open_text.sentences(), eval_sentences, seed, oov_share)
    except FileNotFoundError as exc:
        raise SynthError(str(exc)) from None


def utterances_for_hours(hours: float, text: TextSplit | None) -> int:
    """Training utterances that make about `hours` of speech: sentences' mean words (the
    commands' 4 on average) at the middle speaking rate, plus the silences."""
    words = np.mean([len(s.split()) for s in text.train]) if text is not None else 4.0
    return max(1, round(hours * 3600 / (words * SECONDS_PER_WORD + PAD_SECONDS)))


def _write_indexes(out: Path, plans: list[UtterancePlan], durations: dict[str, float], seed: int) -> dict:
    splits = [split for split in SPLITS if any(p.split == split for p in plans)]
    voices = {split: sorted({p.voice for p in plans if p.split == split}) for split in splits}
    summary = {"seed": seed, "sample_rate": SAMPLE_RATE, "splits": {},
               "engines": ["espeak-ng"] + [prefix.rstrip(":") for prefix in (*EXTERNAL_ENGINES, "world:")
                                            if any(p.voice.startswith(prefix) for p in plans)],
               "voices": {"train": voices["train"], **{s: voices[s] for s in splits if s.startswith("test-unseen")}}}
    for split in splits:
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


def data_overrides(corpus: str | Path, prefix: str = "data.") -> list[str]:
    """`--set` overrides that point a job spec's data at a corpus `synthesize` wrote: each split's
    manifest, and null for a split it lacks (`test_unseen_engine` without Festival).

    Example:
        >>> data_overrides("/tmp/corpus")[0]
        'data.train=/tmp/corpus/train.jsonl'
    """
    corpus = Path(corpus)
    return [f"{prefix}{split.replace('-', '_')}={corpus / f'{split}.jsonl'}"
            if split == "train" or (corpus / f"{split}.jsonl").is_file() else f"{prefix}{split.replace('-', '_')}=null"
            for split in SPLITS]
