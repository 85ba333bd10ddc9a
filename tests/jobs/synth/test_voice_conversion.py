"""WORLD voice conversion (jobs/synth/voice_conversion.py) and chorus synth's converted voices."""

import numpy as np
import pytest
import soundfile as sf

from jobs.synth import voice_conversion
from jobs.synth.corpus import (
    FESTIVAL_TRAIN_VOICES,
    FLITE_TRAIN_VOICES,
    SPLITS,
    UNSEEN_ENGINE_VOICES,
    WORLD_TRAIN_VOICES,
    Festival,
    Flite,
    SynthError,
    plan_corpus,
    synthesize,
)

pytestmark = pytest.mark.unit
RATE = 16000


def _voiced(f0: float, seconds: float = 1.0) -> np.ndarray:
    """A buzz at `f0` (harmonics falling off) through one resonance near 700 Hz: a crude vowel."""
    t = np.arange(int(seconds * RATE)) / RATE
    harmonics = [(k * f0, 1.0 / (1.0 + ((k * f0 - 700.0) / 150.0) ** 2)) for k in range(1, int(4000 // f0))]
    return (0.3 * sum(a * np.sin(2 * np.pi * f * t) for f, a in harmonics) / len(harmonics)).astype(np.float32)


def _median_f0(wav: np.ndarray) -> float:
    world = voice_conversion.pyworld()
    f0, _ = world.dio(wav.astype(np.float64), RATE)
    return float(np.median(f0[f0 > 0]))


def test_conversion_raises_the_pitch_by_the_drawn_factor_and_keeps_the_length():
    wav = _voiced(110.0)
    out = voice_conversion.convert(wav, RATE, seed=7)
    pitch = np.random.default_rng(7).uniform(*voice_conversion.PITCH_SCALE)
    assert out.dtype == np.float32 and out.shape == wav.shape
    assert _median_f0(out) == pytest.approx(_median_f0(wav) * pitch, rel=0.05)
    assert np.array_equal(out, voice_conversion.convert(wav, RATE, seed=7))  # a function of the seed


def test_the_envelope_moves_up_by_the_factor_and_loses_its_fine_detail():
    bins = np.arange(513)
    peak = np.exp(-0.5 * ((bins - 100) / 8.0) ** 2)[None, :] + 1e-6
    assert int(np.argmax(voice_conversion.stretch(peak, 1.2)[0])) == 120
    ripple = peak * (1.0 + 0.5 * np.cos(bins * np.pi / 2))[None, :]  # detail finer than 24 coefficients
    smoothed = voice_conversion.smooth(ripple)
    assert np.abs(np.diff(np.log(smoothed[0, 60:140]), 2)).max() < np.abs(np.diff(np.log(ripple[0, 60:140]), 2)).max()


def test_converted_voices_are_training_voices_only_and_only_when_named():
    assert plan_corpus(500, 40, seed=3, festival=True, flite=True) == plan_corpus(
        500, 40, seed=3, festival=True, flite=True, world=False)  # corpora made before are kept
    plans = plan_corpus(2000, 40, seed=3, festival=True, flite=True, world=True)
    by_split = {split: {p.voice for p in plans if p.split == split} for split in SPLITS}
    assert set(WORLD_TRAIN_VOICES) <= by_split["train"]
    assert not any(v.startswith("world:") for split in SPLITS[1:] if split.startswith("test-unseen")
                   for v in by_split[split])
    assert WORLD_TRAIN_VOICES == [f"world:{v}" for v in FESTIVAL_TRAIN_VOICES + FLITE_TRAIN_VOICES]


def test_without_pyworld_a_converted_voice_is_one_line(monkeypatch, tmp_path):
    # Festival's and flite's voices as if installed (their own absence is an error of its own, first)
    monkeypatch.setattr(Festival, "voices", staticmethod(lambda: set(FESTIVAL_TRAIN_VOICES + UNSEEN_ENGINE_VOICES)))
    monkeypatch.setattr(Flite, "voices", staticmethod(lambda: set(FLITE_TRAIN_VOICES)))
    monkeypatch.setattr(voice_conversion.importlib.util, "find_spec", lambda name: None)
    voice_conversion.pyworld.cache_clear()
    try:
        with pytest.raises(SynthError, match=r"^world voices need pyworld \(pip install pyworld==0\.3\.5\)$"):
            synthesize(tmp_path / "c", utterances=200, eval_utterances=4, seed=3, progress=False,
                       engines="espeak,festival,flite,world")
    finally:
        voice_conversion.pyworld.cache_clear()


@pytest.mark.skipif(not set(FLITE_TRAIN_VOICES) <= Flite.voices()
                    or not set(FESTIVAL_TRAIN_VOICES) <= Festival.voices(),
                    reason="flite or Festival's voices are not installed (make test-deps installs them)")
def test_a_corpus_with_converted_voices_speaks_them_higher(tmp_path):
    summary = synthesize(tmp_path / "c", utterances=60, eval_utterances=4, seed=3, workers=2, progress=False,
                         engines="espeak,festival,flite,world")
    assert summary["engines"] == ["espeak-ng", "festival", "flite", "world"]
    plans = [p for p in plan_corpus(60, 4, seed=3, festival=True, flite=True, world=True) if p.split == "train"]
    f0 = {p.utt_id: _median_f0(sf.read(str(tmp_path / "c" / p.relpath), dtype="float32")[0]) for p in plans
          if p.voice.startswith(("world:", "festival:", "flite:"))}
    converted = [f0[p.utt_id] for p in plans if p.voice in WORLD_TRAIN_VOICES]
    spoken = [f0[p.utt_id] for p in plans if p.voice in FESTIVAL_TRAIN_VOICES + FLITE_TRAIN_VOICES]
    assert len(converted) >= 5 and len(spoken) >= 5, (len(converted), len(spoken))  # seed 3 deals both some
    assert np.median(converted) > 1.3 * np.median(spoken), (converted, spoken)
