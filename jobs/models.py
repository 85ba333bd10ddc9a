"""Acoustic models that map fbank frames to per-frame character log-probabilities for CTC.

Both share a convolutional front end that subsamples time by 4. `bilstm_ctc` follows it with a
bidirectional LSTM (about 1M parameters at the defaults: the fast default); `conformer_ctc` with
torchaudio's Conformer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchaudio.models import Conformer

from jobs.sections import ModelConfig


class ConvSubsampling(nn.Module):
    """Two 3x3 stride-2 convolutions over (time, frequency): frames / 4, then a linear projection and
    LayerNorm (which shortens CTC's initial all-blank plateau by several epochs on the tiny task)."""

    def __init__(self, in_bins: int, channels: int, d_model: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, 3, stride=2), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2), nn.ReLU(),
        )
        out_bins = ((in_bins - 1) // 2 - 1) // 2
        self.proj = nn.Sequential(nn.Linear(channels * out_bins, d_model), nn.LayerNorm(d_model))

    @staticmethod
    def output_lengths(lengths: torch.Tensor) -> torch.Tensor:
        return ((lengths - 1) // 2 - 1) // 2

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv(x.unsqueeze(1))  # (B, C, T', F')
        b, c, t, f = x.shape
        x = self.proj(x.permute(0, 2, 1, 3).reshape(b, t, c * f))
        return x, self.output_lengths(lengths).clamp(min=1, max=t)


class BiLstmCtc(nn.Module):
    def __init__(self, in_bins: int, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        self.subsample = ConvSubsampling(in_bins, cfg.subsample_channels, cfg.d_model)
        self.lstm = nn.LSTM(cfg.d_model, cfg.hidden, num_layers=cfg.layers, batch_first=True,
                            bidirectional=True, dropout=cfg.dropout if cfg.layers > 1 else 0.0)
        self.out = nn.Linear(2 * cfg.hidden, vocab_size)

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, lengths = self.subsample(feats, lengths)
        # The LSTM runs over the padded batch rather than a PackedSequence: on CPU that takes
        # oneDNN's fused kernels, ~1.9x faster in training. Batches are duration-bucketed (about 3%
        # padding), and padded frames are zeroed so the reverse direction starts from neutral input.
        valid = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None].to(x.device)
        x, _ = self.lstm(x * valid.unsqueeze(-1))
        return F.log_softmax(self.out(x).float(), dim=-1), lengths  # float32 under bf16 autocast too


class ConformerCtc(nn.Module):
    def __init__(self, in_bins: int, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        self.subsample = ConvSubsampling(in_bins, cfg.subsample_channels, cfg.d_model)
        self.encoder = Conformer(input_dim=cfg.d_model, num_heads=cfg.heads, ffn_dim=cfg.ffn_dim,
                                 num_layers=cfg.layers, depthwise_conv_kernel_size=cfg.conv_kernel,
                                 dropout=cfg.dropout)
        self.out = nn.Linear(cfg.d_model, vocab_size)

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, lengths = self.subsample(feats, lengths)
        x = x[:, : int(lengths.max())]
        x, lengths = self.encoder(x, lengths)
        return F.log_softmax(self.out(x).float(), dim=-1), lengths  # float32 under bf16 autocast too


def build_model(cfg: ModelConfig, in_bins: int, vocab_size: int) -> nn.Module:
    models = {"bilstm_ctc": BiLstmCtc, "conformer_ctc": ConformerCtc}
    if cfg.kind not in models:
        raise ValueError(f"unknown model kind {cfg.kind!r}")
    return models[cfg.kind](in_bins, vocab_size, cfg)


def ctc_loss(log_probs: torch.Tensor, out_lengths: torch.Tensor, targets: torch.Tensor,
             target_lengths: torch.Tensor) -> torch.Tensor:
    """Mean over utterances of each utterance's summed CTC loss (so batches of any size weigh alike
    per utterance, which is what batch-size-weighted gradient averaging across learners needs)."""
    loss = F.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths, target_lengths,
                      blank=0, reduction="sum", zero_infinity=True)
    return loss / log_probs.shape[0]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
