"""Fuzzing audio decoding (`jobs.data.manifests.load_audio`: every manifest's, LibriSpeech folder's and
shard's audio goes through it): files soundfile writes at any rate, channel count and sample
format, then damaged, and bytes that are no sound file at all. Own error: `AudioError` (its
message one line: the skip reason and what was wrong). What decodes is mono float32 at 16 kHz,
finite, and no longer than the bound it was read with."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jobs.data.manifests import AudioError, load_audio
from tests.fuzz.fuzzing import edited, fuzzed, one_input
from tests.jobs.data.hostile import audio_bytes

pytestmark = pytest.mark.unit

FORMATS = {"WAV": ["PCM_16", "PCM_U8", "FLOAT", "DOUBLE", "ULAW", "IMA_ADPCM"], "FLAC": ["PCM_16", "PCM_24"],
           "OGG": ["VORBIS"], "AIFF": ["PCM_16"], "W64": ["FLOAT"]}


@st.composite
def sound_files(draw) -> bytes:
    fmt = draw(st.sampled_from(sorted(FORMATS)))
    rate = draw(st.sampled_from([8000, 16_000, 22_050, 44_100, 48_000]) | st.integers(1, 200_000))
    channels = draw(st.integers(1, 3))
    frames = draw(st.integers(1, 4000))
    subtype = draw(st.sampled_from(FORMATS[fmt]))
    kind = draw(st.sampled_from(["tone", "silence", "loud", "special"]))
    if kind == "special" and subtype in ("FLOAT", "DOUBLE"):  # what a float file may hold: NaN, infinities, 1e30
        # (only there: libsndfile's own u-law encoder crashes the process on them)
        samples = np.array(draw(st.lists(st.sampled_from([np.nan, np.inf, -np.inf, 1e30, 0.5]), min_size=1,
                                         max_size=8)) * (frames // 8 + 1), dtype=np.float32)[:frames]
        samples = np.repeat(samples[:, None], channels, axis=1)
    else:
        samples = {"silence": np.zeros((frames, channels), np.float32),
                   "loud": np.full((frames, channels), 4.0, np.float32)}.get(kind)
    try:
        data = audio_bytes(frames / rate, rate=rate, fmt=fmt, subtype=subtype, channels=channels, samples=samples)
    except Exception:  # noqa: BLE001 - a combination soundfile will not write (OGG at 1 Hz, NaN in FLAC)
        data = audio_bytes(0.1)
    return draw(st.just(data) | edited(data, 3))


@fuzzed(100)
@given(data=sound_files() | st.binary(max_size=512), max_seconds=st.none() | st.floats(0.01, 2.0))
@example(data=audio_bytes(samples=np.full((400, 1), np.nan, np.float32), subtype="FLOAT"), max_seconds=1.0)
@example(data=audio_bytes(0.05, rate=96_001), max_seconds=None)  # was a 1.5 G-tap resampling kernel (killed)
@example(data=audio_bytes(0.05, rate=7919), max_seconds=1.0)  # was 6 s a second of audio
@example(data=audio_bytes(samples=np.zeros((2261, 1), np.float32), rate=1, fmt="AIFF"), max_seconds=None)  # 1 Hz:
# 4 KB of file were 36 M samples, 2 s of work
def test_audio_decodes_to_a_bounded_finite_waveform_or_is_an_audio_error(data, max_seconds):
    with one_input(AudioError):
        waveform = load_audio(io.BytesIO(data), max_seconds)
        assert waveform.dtype.is_floating_point and waveform.dim() == 1 and len(waveform) > 0
        assert bool(waveform.isfinite().all())
        if max_seconds is not None:
            assert len(waveform) <= max_seconds * 16_000 + 2
