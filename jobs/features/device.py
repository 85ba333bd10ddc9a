"""A training batch's augmentation and filterbanks, batched on the learner's device
(`features.compute_on`): the input path (worker processes, on the CPU) decodes audio and draws each
utterance's augmentation (`jobs.features.augment.Draws`, from the same (seed, epoch, utterance) streams as
the CPU path); speed perturbation, reverberation, noise, the (VTLP-warped) filterbanks and the
per-utterance normalization run here, on the whole padded batch at once, where the model is.

The result is the CPU path's (`Augment.apply` then `Fbank` per utterance) to float rounding: every
stage masks what lies past an utterance's own length, so padding never leaks into it; each
utterance is reflect-padded at its own ends before the STFT, as the per-utterance `center=True`
STFT pads it; and a reverberation's FFT is longer, which changes only rounding.
`tests/jobs/features/test_device.py` states the tolerance.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
import torchaudio.functional as AF

from jobs.features.augment import Draws, sped_length, speed_resampler
from jobs.features.filterbanks import SAMPLE_RATE, Fbank

N_FFT, HOP = 400, 160  # Fbank's 25 ms window, 10 ms hop


@dataclass
class AudioBatch:
    """Clean waveforms of a batch, zero-padded (batch, samples), with their lengths and each
    utterance's draws: speed factors, room impulse responses (zero-padded, length 0: none), noise
    (zero-padded to the sped-up lengths) with SNRs in dB (NaN: none), VTLP warps."""

    waves: torch.Tensor
    lengths: torch.Tensor
    speeds: list[float]
    rirs: torch.Tensor
    rir_lengths: torch.Tensor
    noise: torch.Tensor
    snr_db: torch.Tensor
    warps: torch.Tensor

    @classmethod
    def of(cls, waves: list[torch.Tensor], draws: list[Draws]) -> AudioBatch:
        def padded(tensors: list[torch.Tensor]) -> torch.Tensor:
            return torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True) if tensors else torch.zeros(0, 0)

        empty = torch.zeros(1)  # (pad_sequence needs one non-empty row to know a width)
        rirs = [d.rir if d.rir is not None else empty[:0] for d in draws]
        noise = [d.noise if d.noise is not None else empty[:0] for d in draws]
        return cls(waves=padded([w.float() for w in waves]), lengths=torch.tensor([len(w) for w in waves]),
                   speeds=[d.speed for d in draws], rirs=padded(rirs + [empty])[:-1],
                   rir_lengths=torch.tensor([len(r) for r in rirs]), noise=padded(noise + [empty])[:-1],
                   snr_db=torch.tensor([d.snr_db if d.noise is not None else float("nan") for d in draws]),
                   warps=torch.tensor([d.warp for d in draws]))

    def _tensors(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self) if f.name != "speeds"]

    def to(self, device: torch.device) -> AudioBatch:
        return dataclasses.replace(self, **{k: getattr(self, k).to(device, non_blocking=True) for k in self._tensors()})

    def rows(self, part: slice) -> AudioBatch:
        """These rows of the batch (`Batch.halves`)."""
        rows = {k: getattr(self, k)[part] for k in self._tensors()}
        return dataclasses.replace(self, speeds=self.speeds[part], **rows)

    def pin_memory(self) -> AudioBatch:
        return dataclasses.replace(self, **{k: getattr(self, k).pin_memory() for k in self._tensors()})


def _mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    return torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]


class DeviceFeatures:
    """`AudioBatch` -> (features (batch, frames, bins), zero-padded and normalized, frame counts),
    computed on the batch's device."""

    def __init__(self, fbank: Fbank):
        self.fbank = fbank
        self._on: dict[tuple[str, object], torch.Tensor | torch.nn.Module] = {}  # kernels, per device

    def _kept(self, key: object, device: torch.device, make):
        if (str(device), key) not in self._on:
            self._on[(str(device), key)] = make()
        return self._on[(str(device), key)]

    @torch.no_grad()
    def __call__(self, audio: AudioBatch) -> tuple[torch.Tensor, torch.Tensor]:
        waves, lengths = self.speed(audio)
        waves = self.reverberate(waves, lengths, audio)
        noisy = ~torch.isnan(audio.snr_db)
        if bool(noisy.any()):
            noise = torch.nn.functional.pad(audio.noise, (0, max(0, waves.shape[1] - audio.noise.shape[1])))
            waves[noisy] = AF.add_noise(waves[noisy], noise[noisy, : waves.shape[1]], audio.snr_db[noisy],
                                        lengths[noisy])
        return self.filterbanks(waves, lengths, audio.warps)

    def speed(self, audio: AudioBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The waveforms after speed perturbation, grouped by factor, and their new lengths."""
        device = audio.waves.device
        lengths = torch.tensor([sped_length(int(n), f) for n, f in zip(audio.lengths.tolist(), audio.speeds,
                                                                        strict=True)], device=device)
        out = torch.zeros(len(lengths), int(lengths.max()), device=device)
        for factor in sorted(set(audio.speeds)):
            rows = torch.tensor([i for i, f in enumerate(audio.speeds) if f == factor], device=device)
            waves = audio.waves[rows, : int(audio.lengths[rows].max())]
            if factor != 1.0:
                resampler = self._kept(("speed", factor), device, lambda f=factor: copy.deepcopy(
                    speed_resampler(f)).to(device))
                waves = resampler(waves)
            width = min(waves.shape[1], out.shape[1])
            out[rows, :width] = waves[:, :width]
        return out * _mask(lengths, out.shape[1]), lengths

    @staticmethod
    def reverberate(waves: torch.Tensor, lengths: torch.Tensor, audio: AudioBatch) -> torch.Tensor:
        """The rows with a room impulse response convolved with it (by one FFT size for all),
        kept to their own length and loudness."""
        rows = (audio.rir_lengths > 0).nonzero().flatten()
        if not len(rows):
            return waves
        mask = _mask(lengths[rows], waves.shape[1])
        wet = waves[rows]
        level = (wet.pow(2).sum(1) / lengths[rows]).sqrt()
        n = 1 << (waves.shape[1] + audio.rirs.shape[1] - 2).bit_length()
        wet = torch.fft.irfft(torch.fft.rfft(wet, n) * torch.fft.rfft(audio.rirs[rows], n), n)[:, : waves.shape[1]]
        wet = wet * mask
        scale = level / (wet.pow(2).sum(1) / lengths[rows]).sqrt().clamp_min(1e-8)
        waves[rows] = wet * scale[:, None]
        return waves

    def filterbanks(self, waves: torch.Tensor, lengths: torch.Tensor,
                    warps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalized log-mel frames of each row's first `lengths` samples, read through filters
        warped by its VTLP factor."""
        device, half = waves.device, N_FFT // 2
        # each row reflected at its own ends, as a center=True STFT of it alone would pad it
        at = (torch.arange(waves.shape[1] + N_FFT, device=device)[None, :] - half).abs()
        last = (lengths - 1)[:, None]
        at = torch.where(at > last, 2 * last - at, at)
        padded = waves.gather(1, at.clamp(0, waves.shape[1] - 1)) * _mask(lengths + N_FFT, at.shape[1])
        window = self._kept("window", device, lambda: torch.hann_window(N_FFT, device=device))
        power = torch.stft(padded, N_FFT, HOP, window=window, center=False, return_complex=True).abs().pow(2)
        mel = power.transpose(1, 2) @ self.warped_filters(warps)  # (batch, frames, bins)
        frames = lengths // HOP + 1
        valid = _mask(frames, mel.shape[1])[..., None]
        logmel = torch.log(mel + 1e-6)
        mean = (logmel * valid).sum(1, keepdim=True) / frames[:, None, None]
        var = ((logmel - mean) * valid).pow(2).sum(1, keepdim=True) / (frames[:, None, None] - 1).clamp_min(1)
        feats = (logmel - mean) / var.sqrt().clamp_min(1e-5) * valid
        return feats[:, : int(frames.max())], frames

    def warped_filters(self, warps: torch.Tensor) -> torch.Tensor:
        """The mel filterbank (batch, n_freqs, n_mels) read at each row's VTLP-warped frequencies
        (`Fbank.warped_filters`, for a batch of warps); a warp of 1 reads the filterbank itself."""
        device = warps.device
        filters = self._kept("filters", device, lambda: self.fbank.filters.to(device))
        n_freqs, nyquist, boundary = filters.shape[0], SAMPLE_RATE / 2, 4800.0
        freqs = self._kept("freqs", device, lambda: torch.linspace(0, nyquist, n_freqs).to(device))[None, :]
        alpha = warps[:, None].float()
        knee = boundary * alpha.clamp(max=1.0) / alpha
        upper = nyquist - (nyquist - boundary * alpha.clamp(max=1.0)) / (nyquist - knee) * (nyquist - freqs)
        position = torch.where(freqs <= knee, freqs * alpha, upper) / nyquist * (n_freqs - 1)
        low = position.floor().long().clamp(0, n_freqs - 1)
        high = (low + 1).clamp(max=n_freqs - 1)
        frac = (position - low)[..., None]
        warped = filters[low] * (1 - frac) + filters[high] * frac
        return torch.where((warps == 1.0)[:, None, None], filters, warped)
