"""Voice conversion by the WORLD vocoder (pyworld), for `chorus synth`'s "world:<voice>" voices.

An utterance another voice spoke is analysed into its pitch (F0), spectral envelope and
aperiodicity, then resynthesized with the pitch raised, the envelope stretched along frequency
(formants moved up, as a shorter vocal tract moves them) and smoothed (a low-order cepstrum): a
male voice becomes a higher, vocoded one, the kind of speech a statistical-parametric synthesizer
makes. How far pitch and formants move is drawn per utterance from its own seed.

Example:
    >>> import numpy as np
    >>> t = np.arange(16000) / 16000
    >>> y = convert(np.sin(2 * np.pi * 120 * t).astype(np.float32), 16000, seed=0)
    >>> y.shape, y.dtype
    ((16000,), dtype('float32'))
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType

import numpy as np

PITCH_SCALE = (1.5, 1.9)  # F0 multiplied by a draw from this range: a male voice's ~110 Hz to ~165-210 Hz
FORMANT_SCALE = (1.1, 1.2)  # the envelope stretched by this much: formants of a shorter vocal tract
CEPSTRAL_ORDER = 24  # the envelope kept to this many cepstral coefficients: smooth, as a vocoder's


class VoiceConversionError(RuntimeError):
    pass


@cache
def pyworld() -> ModuleType:
    """pyworld's compiled module, loaded without its package's `__init__` (which imports
    `pkg_resources`, gone from setuptools since 81, only to read its own version)."""
    spec = importlib.util.find_spec("pyworld")
    if spec is None or not spec.submodule_search_locations:
        raise VoiceConversionError("world voices need pyworld (pip install pyworld==0.3.5)")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("pyworld*.so"))
    if not found:
        raise VoiceConversionError(f"pyworld's compiled module not found in {spec.submodule_search_locations[0]}")
    module_spec = importlib.util.spec_from_file_location("pyworld", found[0])
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def convert(wav: np.ndarray, rate: int, seed: int) -> np.ndarray:
    """`wav` (float or int16, mono, at `rate`) with its pitch raised and formants moved up by
    amounts drawn from `seed`; float32 at `rate`, as long as `wav`."""
    world = pyworld()
    rng = np.random.default_rng(seed)
    pitch, formants = rng.uniform(*PITCH_SCALE), rng.uniform(*FORMANT_SCALE)
    x = wav.astype(np.float64) / (32768.0 if wav.dtype == np.int16 else 1.0)
    f0, times = world.dio(x, rate)
    f0 = world.stonemask(x, f0, times, rate)
    envelope = world.cheaptrick(x, f0, times, rate)
    aperiodicity = world.d4c(x, f0, times, rate)
    y = world.synthesize(f0 * pitch, smooth(stretch(envelope, formants)), aperiodicity, rate)
    return _fit(y, len(x)).astype(np.float32)


def stretch(envelope: np.ndarray, factor: float) -> np.ndarray:
    """Each frame's envelope moved up in frequency by `factor` (bin b takes bin b / factor's value;
    the top bins take the last)."""
    bins = np.arange(envelope.shape[1])
    return np.stack([np.interp(bins / factor, bins, frame) for frame in envelope])


def smooth(envelope: np.ndarray, order: int = CEPSTRAL_ORDER) -> np.ndarray:
    """Each frame's envelope through its first `order` cepstral coefficients (the liftered log)."""
    cepstrum = np.fft.irfft(np.log(np.maximum(envelope, 1e-16)), axis=1)
    cepstrum[:, order:-order] = 0.0
    return np.exp(np.fft.rfft(cepstrum, axis=1).real)


def _fit(y: np.ndarray, length: int) -> np.ndarray:
    return y[:length] if len(y) >= length else np.pad(y, (0, length - len(y)))
