"""Acoustic features: log-mel filterbanks, per-utterance mean/variance normalization, vocal tract
length perturbation (a warp of the filterbank's frequency axis) and SpecAugment (torchaudio's
masks); the last two in training only."""

from __future__ import annotations

import torch
import torchaudio

from jobs.sections import FeatureConfig

SAMPLE_RATE = 16_000
HOP = 160  # samples from one frame to the next (10 ms)
FLOOR = 1e-6  # added to the mel power before its log


def frames_in(seconds: float) -> float:
    """The most frames `Fbank` makes of `seconds` of audio (a frame every HOP samples, and one more)."""
    return seconds * SAMPLE_RATE / HOP + 1


def vtlp_frequencies(freqs: torch.Tensor, alpha: float, nyquist: float = SAMPLE_RATE / 2,
                     boundary_hz: float = 4800.0) -> torch.Tensor:
    """Jaitly and Hinton's (2013) vocal tract length perturbation warp: frequency f -> alpha * f up to
    `boundary_hz * min(alpha, 1) / alpha`, then a straight line to the Nyquist frequency, which stays
    put (so nothing is pushed off the spectrum's top or leaves a gap there)."""
    knee = boundary_hz * min(alpha, 1.0) / alpha
    upper = nyquist - (nyquist - boundary_hz * min(alpha, 1.0)) / (nyquist - knee) * (nyquist - freqs)
    return torch.where(freqs <= knee, freqs * alpha, upper)


class Fbank:
    """Waveform (16 kHz, mono) -> normalized log-mel frames (frames, num_mel_bins), 25 ms / 10 ms.
    With `warp` != 1 the mel filters read the spectrum at VTLP-warped frequencies (`vtlp_frequencies`),
    as a vocal tract `warp` times shorter would place its formants."""

    def __init__(self, num_mel_bins: int = 80):
        self.num_mel_bins = num_mel_bins
        self._mel = torchaudio.transforms.MelSpectrogram(
            sample_rate=SAMPLE_RATE, n_fft=400, win_length=400, hop_length=HOP, n_mels=num_mel_bins
        )

    @property
    def filters(self) -> torch.Tensor:
        """The mel filterbank (n_freqs, n_mels): torchaudio's HTK triangles, 0-8000 Hz."""
        return self._mel.mel_scale.fb

    @property
    def window_length(self) -> int:
        """Samples of the Hann window each frame is read through (25 ms)."""
        return self._mel.win_length

    def warped_filters(self, warp: float) -> torch.Tensor:
        """The mel filterbank (n_freqs, n_mels) evaluated at the warped frequency of each FFT bin."""
        filters = self.filters
        n_freqs = filters.shape[0]
        nyquist = SAMPLE_RATE / 2
        position = vtlp_frequencies(torch.linspace(0, nyquist, n_freqs), warp) / nyquist * (n_freqs - 1)
        low = position.floor().long().clamp(0, n_freqs - 1)
        high = (low + 1).clamp(max=n_freqs - 1)
        frac = (position - low).unsqueeze(1)
        return filters[low] * (1 - frac) + filters[high] * frac

    @torch.no_grad()
    def __call__(self, waveform: torch.Tensor, warp: float = 1.0) -> torch.Tensor:
        return normalized(self.log_mel(waveform, warp))

    @torch.no_grad()
    def log_mel(self, waveform: torch.Tensor, warp: float = 1.0) -> torch.Tensor:
        """Log-mel power (frames, num_mel_bins), not normalized: what audio shards may carry
        precomputed (`chorus shards --features`), augmented in this domain by `jobs.features.mel_augment`."""
        if warp == 1.0:
            mel = self._mel(waveform.float())  # (n_mels, frames)
        else:
            power = self._mel.spectrogram(waveform.float())  # (n_freqs, frames)
            mel = self.warped_filters(warp).transpose(0, 1) @ power
        return torch.log(mel + FLOOR).transpose(0, 1)


def normalized(logmel: torch.Tensor) -> torch.Tensor:
    """Per-utterance mean and variance normalization of each channel (frames, bins)."""
    std, mean = torch.std_mean(logmel, dim=0, keepdim=True)
    return (logmel - mean) / std.clamp_min(1e-5)


class SpecAugment:
    """Frequency and time masking of a padded batch (batch, frames, bins), in place of nothing:
    returns a masked copy. Each utterance gets its own masks (torchaudio's iid_masks)."""

    def __init__(self, cfg: FeatureConfig):
        self.masks = []
        if cfg.freq_mask > 0:
            self.masks += [torchaudio.transforms.FrequencyMasking(cfg.freq_mask, iid_masks=True)] * cfg.num_freq_masks
        if cfg.time_mask > 0:
            self.masks += [torchaudio.transforms.TimeMasking(cfg.time_mask, iid_masks=True)] * cfg.num_time_masks

    def __call__(self, feats: torch.Tensor) -> torch.Tensor:
        if not self.masks:
            return feats
        x = feats.transpose(1, 2).unsqueeze(1)  # (batch, 1, bins, frames), as torchaudio expects
        for mask in self.masks:
            x = mask(x)
        return x.squeeze(1).transpose(1, 2)
