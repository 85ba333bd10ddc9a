"""Augmentation in the log-mel domain, for audio shards that carry each utterance's log-mel power
precomputed (`chorus shards --features`, `data.shard_features`): a learner then neither decodes
audio nor computes filterbanks, and augments what it reads in well under a millisecond.

An utterance gets the same choices as on the waveform (`Augment.choices`: speed factor, room,
noise, VTLP warp, from (seed, epoch, utterance) alone), each applied as what it does to the
filterbank's output, approximately:

- speed perturbation by f: the frames stretched in time by 1/f (linear interpolation) and every
  frequency scaled by f: output channel at frequency c reads the input at c / f (nothing above the
  input's top: silence, as the resampler's low-pass leaves it);
- VTLP by a: the output channel at c reads the input at the warp's inverse of c (`vtlp_frequencies`);
- a room of reverberation time T: each channel's power convolved with the impulse response's
  energy per frame (the direct path, then the tail of `augment.synthetic_rir`'s statistical model,
  decaying by 60 dB over T), the loudness kept;
- white noise at an SNR: its expected mel power per channel (the utterance's mean sample power,
  stored with its features, over 10^(SNR/10), times the window's energy and the channel's filter
  weights), scattered frame by frame with the spread of a periodogram summed under the filter.

Then the log and per-utterance normalization, as `Fbank` does. What is lost against the waveform
path: the exact resampler filter, the reverberant tail's phase and the noise's fine structure.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from jobs.features.augment import RIR_TAIL, Augment, Choices
from jobs.features.filterbanks import FLOOR, SAMPLE_RATE, Fbank, normalized, vtlp_frequencies

HOP_S = 0.01  # the filterbank's frame shift (160 samples)
HZ_GRID = torch.linspace(0.0, SAMPLE_RATE / 2, 801, dtype=torch.float64)  # where VTLP's warp is read


def hz_to_mel(hz):
    return 2595.0 * np.log10(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)


def independent_bins(filters: torch.Tensor) -> torch.Tensor:
    """Per mel channel, the independent periodogram bins its filter sums (the degrees of freedom of
    its white-noise power, halved): (sum a_k)^2 / sum_kl a_k a_l |rho_kl|^2, where a Hann window
    correlates a bin's noise with its neighbours' by |rho| = 2/3 and with the next by 1/6."""
    a = filters.double()
    spread = a.pow(2).sum(0) + 2 * (4 / 9) * (a[1:] * a[:-1]).sum(0) + 2 * (1 / 36) * (a[2:] * a[:-2]).sum(0)
    return (a.sum(0) ** 2 / spread.clamp_min(1e-12)).float()


class MelAugment:
    """`Augment`'s choices applied to an utterance's log-mel power (frames, bins); returns its
    normalized features. Args: augment (the choices), fbank (the channels' filters)."""

    def __init__(self, augment: Augment, fbank: Fbank):
        self.augment = augment
        filters = fbank.filters
        self.bins = filters.shape[1]
        points = np.linspace(hz_to_mel(0.0), hz_to_mel(SAMPLE_RATE / 2), self.bins + 2)
        self.first_center, self.spacing = points[1], points[1] - points[0]
        self.centers_hz = 700.0 * (10 ** (points[1:-1] / 2595.0) - 1.0)
        window_energy = float(torch.hann_window(fbank.window_length).pow(2).sum())
        self.noise_per_bin = window_energy * filters.sum(0)  # mel power of unit-variance white noise
        self.noise_spread = torch.sqrt(torch.log1p(1.0 / independent_bins(filters)))  # a log-normal's sigma

    @torch.no_grad()
    def __call__(self, log_mel: torch.Tensor, power: float, epoch: int, index: int) -> torch.Tensor:
        choice = self.augment.choices(epoch, index)
        mel = self._moved(log_mel.float(), choice.speed, choice.warp).exp().sub(FLOOR).clamp_min(0.0)
        if choice.rt60_s is not None:
            mel = self._reverberated(mel, choice.rt60_s)
        if choice.snr_db is not None:
            mel = mel + self._noise(mel.shape[0], power, choice)
        return normalized(torch.log(mel + FLOOR))

    def _moved(self, log_mel: torch.Tensor, speed: float, warp: float) -> torch.Tensor:
        """Speed perturbation's and VTLP's frequency maps, then speed's stretch in time."""
        if speed != 1.0 or warp != 1.0:
            log_mel = self._read_at(log_mel, self._source_hz(speed, warp))
        if speed != 1.0:
            frames = round((log_mel.shape[0] - 1) / speed) + 1
            log_mel = F.interpolate(log_mel.T[None], size=frames, mode="linear", align_corners=True)[0].T
        return log_mel

    def _source_hz(self, speed: float, warp: float) -> np.ndarray:
        """The input frequency each output channel's centre reads."""
        warped = vtlp_frequencies(HZ_GRID, warp).numpy() if warp != 1.0 else HZ_GRID.numpy()
        return np.interp(self.centers_hz, warped, HZ_GRID.numpy()) / speed

    def _read_at(self, log_mel: torch.Tensor, hz: np.ndarray) -> torch.Tensor:
        """The channels read at frequencies `hz` (linear between channel centres, as one matrix
        product); above the top channel, silence."""
        position = np.clip((hz_to_mel(hz) - self.first_center) / self.spacing, 0.0, None)
        low = np.minimum(np.floor(position).astype(int), self.bins - 1)
        high, frac, out = np.minimum(low + 1, self.bins - 1), position - low, np.arange(self.bins)
        silent = position > self.bins - 0.5
        weights = np.zeros((self.bins, self.bins), dtype=np.float32)
        weights[low, out] = np.where(silent, 0.0, 1 - frac)  # `out` names each column once: no index twice
        weights[high, out] += np.where(silent, 0.0, frac)
        bias = torch.from_numpy(np.where(silent, math.log(FLOOR), 0.0).astype(np.float32))
        return log_mel @ torch.from_numpy(weights) + bias

    @staticmethod
    def _reverberated(mel: torch.Tensor, rt60_s: float) -> torch.Tensor:
        """Each channel's power through the room's energy per frame; the total power kept."""
        taps = max(2, math.ceil(rt60_s / HOP_S) + 1)
        samples = HOP_S * SAMPLE_RATE
        largest = math.sqrt(2.0 * math.log(rt60_s * SAMPLE_RATE))  # the tail's expected largest sample
        t = torch.arange(taps, dtype=torch.float32) * HOP_S
        energy = samples * (RIR_TAIL / largest) ** 2 * torch.exp(-2 * 3 * math.log(10) * t / rt60_s)
        energy[0] += 1.0  # the direct path
        padded = F.pad(mel.T[None], (taps - 1, 0))  # (1, bins, frames): causal
        bins = mel.shape[1]  # a channel each (groups): 2.7x faster than the bins as a batch of one channel
        out = F.conv1d(padded, energy.flip(0)[None, None].expand(bins, 1, taps), groups=bins)[0].T
        return out * (mel.sum() / out.sum().clamp_min(1e-12))

    def _noise(self, frames: int, power: float, choice: Choices) -> torch.Tensor:
        variance = power / 10 ** (choice.snr_db / 10)
        spread = torch.randn(frames, self.bins, generator=choice.noise) * self.noise_spread
        return variance * self.noise_per_bin * torch.exp(spread - self.noise_spread ** 2 / 2)
