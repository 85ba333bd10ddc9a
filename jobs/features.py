"""Acoustic features: 80-dim log-mel filterbanks, per-utterance mean/variance normalization and
SpecAugment (torchaudio's masks), applied in training only."""

from __future__ import annotations

import torch
import torchaudio

from jobs.sections import FeatureConfig

SAMPLE_RATE = 16_000


class Fbank:
    """Waveform (16 kHz, mono) -> normalized log-mel frames (frames, num_mel_bins), 25 ms / 10 ms."""

    def __init__(self, num_mel_bins: int = 80):
        self.num_mel_bins = num_mel_bins
        self._mel = torchaudio.transforms.MelSpectrogram(
            sample_rate=SAMPLE_RATE, n_fft=400, win_length=400, hop_length=160, n_mels=num_mel_bins
        )

    @torch.no_grad()
    def __call__(self, waveform: torch.Tensor) -> torch.Tensor:
        mel = self._mel(waveform.float())  # (n_mels, frames)
        logmel = torch.log(mel + 1e-6).transpose(0, 1)
        mean = logmel.mean(dim=0, keepdim=True)
        std = logmel.std(dim=0, keepdim=True).clamp_min(1e-5)
        return (logmel - mean) / std


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
