"""Waveform augmentation of training utterances, on the fly and seeded: speed perturbation (one
factor of a list, as Kaldi's and ESPnet's recipes do: tempo and pitch together), reverberation by
a synthetic room impulse response, and additive white noise at a random SNR, in that order (a room
first, then the microphone's noise). `warp` draws an utterance's vocal tract length perturbation
factor, which the filterbank applies (`jobs/features/filterbanks.py`, as SpecAugment).

What an utterance hears is a function of (seed, epoch, utterance index) alone: the same run hears
the same thing again, whatever learner or thread prepares the batch, and each epoch hears each
utterance anew. Only training batches are augmented (`ShardBatches` passes its epoch); evaluation
reads clean audio.

Example:
    >>> augment = Augment(AugmentConfig(speed_factors=[0.9, 1.0, 1.1], noise_prob=0.5), seed=0)
    >>> wave = torch.randn(16_000)
    >>> torch.equal(augment(wave, epoch=3, index=42), augment(wave, epoch=3, index=42))
    True
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cache

import torch
import torchaudio.functional as AF
from torchaudio.transforms import Resample

from jobs.sections import AugmentConfig

SAMPLE_RATE = 16_000


def utterance_generator(seed: int, epoch: int, index: int, kind: str) -> torch.Generator:
    """A generator seeded from (seed, epoch, index, kind) by a hash, so no two share a stream."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}:{kind}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))


RIR_TAIL = 0.3  # a synthetic room's reverberant tail at its loudest, relative to the direct path


def synthetic_rir(rt60_s: float, generator: torch.Generator, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """A room impulse response: a unit direct path, then white noise decaying by 60 dB over `rt60_s`
    (Schroeder's statistical model of a diffuse reverberant tail), 2.5 ms after the direct path."""
    n = max(2, int(rt60_s * sample_rate))
    t = torch.arange(n, dtype=torch.float32) / sample_rate
    tail = torch.randn(n, generator=generator) * torch.exp(-3 * math.log(10) * t / rt60_s)
    rir = torch.zeros(n + int(0.0025 * sample_rate))
    rir[0] = 1.0
    rir[-n:] += RIR_TAIL * tail / tail.abs().max().clamp_min(1e-8)
    return rir


@cache
def speed_resampler(factor: float, sample_rate: int = SAMPLE_RATE) -> Resample:
    """Speed perturbation by `factor` as `torchaudio.functional.speed` does it (audio read as if
    sampled at `factor` times the rate, resampled back), with its filter kernel built once per
    factor, not once per utterance (which was 80% of a call's time: 0.7 ms of a 1.6 s utterance)."""
    source = int(factor * sample_rate)
    gcd = math.gcd(source, sample_rate)
    return Resample(source // gcd, sample_rate // gcd)


def reverberate(wave: torch.Tensor, rir: torch.Tensor) -> torch.Tensor:
    """`wave` convolved with `rir`, its first len(wave) samples: by FFT at the next power of two
    (at the exact full length, often a size with a large prime factor, the FFTs took 3x as long)."""
    n = 1 << (wave.shape[-1] + rir.shape[-1] - 2).bit_length()
    return torch.fft.irfft(torch.fft.rfft(wave, n) * torch.fft.rfft(rir, n), n)[: wave.shape[-1]]


@dataclass
class Draws:
    """What augmentation draws for one utterance of one epoch: its speed factor, a room impulse
    response (None: no reverberation), white noise of the sped-up length and its SNR in dB (None:
    no noise), and its VTLP warp. Drawn on the CPU from the utterance's own generators, applied
    there (`Augment.apply`) or batched on the learner's device (`jobs.features.device`)."""

    speed: float = 1.0
    rir: torch.Tensor | None = None
    noise: torch.Tensor | None = None
    snr_db: float = 0.0
    warp: float = 1.0


@dataclass
class Choices:
    """An utterance's augmentation for one epoch as numbers: speed factor, reverberation time (None:
    no room), SNR in dB (None: no noise), VTLP warp; and the room's and the noise's generators,
    positioned after those numbers, for whatever is drawn from them next."""

    speed: float = 1.0
    rt60_s: float | None = None
    snr_db: float | None = None
    warp: float = 1.0
    room: torch.Generator | None = None
    noise: torch.Generator | None = None


def sped_length(length: int, factor: float) -> int:
    """Samples of a `length`-sample waveform after speed perturbation by `factor`: torchaudio's
    resampler's own expression (`_apply_sinc_resample_kernel`), so they agree to the sample."""
    if factor == 1.0:
        return length
    resampler = speed_resampler(factor)
    orig, new = resampler.orig_freq // resampler.gcd, resampler.new_freq // resampler.gcd
    return int(torch.ceil(torch.as_tensor(new * length / orig)))


class Augment:
    """`AugmentConfig` applied to one waveform (16 kHz, 1-D float); `enabled` says whether any kind is on."""

    def __init__(self, config: AugmentConfig, seed: int = 0):
        self.config, self.seed = config, seed

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    @torch.no_grad()
    def __call__(self, waveform: torch.Tensor, epoch: int, index: int) -> torch.Tensor:
        return self.apply(waveform, self.draws(epoch, index, waveform.shape[-1]))

    def draws(self, epoch: int, index: int, length: int) -> Draws:
        """Utterance `index`'s draws for `epoch`, for a waveform of `length` samples."""
        choice = self.choices(epoch, index)
        drawn = Draws(speed=choice.speed, warp=choice.warp)
        if choice.rt60_s is not None:
            drawn.rir = synthetic_rir(choice.rt60_s, choice.room)
        if choice.snr_db is not None:
            drawn.snr_db = choice.snr_db
            drawn.noise = torch.randn(sped_length(length, drawn.speed), generator=choice.noise)
        return drawn

    def choices(self, epoch: int, index: int) -> Choices:
        """What augmentation chose for utterance `index` in `epoch`, before anything is built from it:
        the waveform's draws (`draws`) and the filterbank domain's (`jobs.features.mel_augment`) agree."""
        c = self.config
        # each kind draws from a stream of its own, so switching one kind on or off changes nothing
        # of what the others do to the same utterance
        speed, room, noise = (utterance_generator(self.seed, epoch, index, kind) for kind in ("speed", "room", "noise"))

        def uniform(low: float, high: float, g: torch.Generator) -> float:
            return low + (high - low) * float(torch.rand((), generator=g))

        chosen = Choices(warp=self.warp(epoch, index), room=room, noise=noise)
        if c.speed_factors:
            chosen.speed = c.speed_factors[int(torch.randint(len(c.speed_factors), (), generator=speed))]
        if uniform(0, 1, room) < c.reverb_prob:
            chosen.rt60_s = uniform(*c.reverb_rt60_s, room)
        if uniform(0, 1, noise) < c.noise_prob:
            chosen.snr_db = uniform(*c.noise_snr_db, noise)
        return chosen

    @staticmethod
    @torch.no_grad()
    def apply(waveform: torch.Tensor, drawn: Draws) -> torch.Tensor:
        """One waveform augmented as `drawn` says, on the CPU (the VTLP warp is the filterbank's)."""
        out = waveform.float()
        if drawn.speed != 1.0:
            out = speed_resampler(drawn.speed)(out)
        if drawn.rir is not None:
            level = out.pow(2).mean().sqrt()
            out = reverberate(out, drawn.rir)
            out = out * (level / out.pow(2).mean().sqrt().clamp_min(1e-8))  # the same loudness as before
        if drawn.noise is not None:
            out = AF.add_noise(out[None], drawn.noise[None], torch.tensor([drawn.snr_db]))[0]
        return out

    def warp(self, epoch: int, index: int) -> float:
        """The utterance's VTLP factor for `epoch` (uniform in `vtlp_warp`), 1.0 when that is off."""
        if self.config.vtlp_warp is None:
            return 1.0
        low, high = self.config.vtlp_warp
        draw = torch.rand((), generator=utterance_generator(self.seed, epoch, index, "vtlp"))
        return low + (high - low) * float(draw)
