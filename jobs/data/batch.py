"""A training or evaluation batch: padded features (or the waveforms to compute them from on the
learner's device), CTC targets, texts and ids; what a corpus, a worker or a shard stream hands a
learner, and how it moves to a device, halves, and gets its features."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from jobs.features.device import AudioBatch, DeviceFeatures


@dataclass
class Batch:
    feats: torch.Tensor | None  # (batch, frames, bins), zero-padded; None until `featurized` when `audio` is set
    feat_lengths: torch.Tensor | None
    targets: torch.Tensor  # concatenated character ids
    target_lengths: torch.Tensor
    texts: list[str]
    ids: list[str]
    audio: AudioBatch | None = None  # features to compute on the learner's device (`features.compute_on`)

    @property
    def size(self) -> int:
        return len(self.ids)

    def _tensors(self) -> list[str]:
        return [k for k in ("feats", "feat_lengths", "targets", "target_lengths") if getattr(self, k) is not None]

    def to(self, device: torch.device) -> Batch:
        """The batch with its tensors on `device`."""
        return dataclasses.replace(self, **{k: getattr(self, k).to(device, non_blocking=True) for k in self._tensors()},
                                   audio=self.audio.to(device) if self.audio is not None else None)

    def pin_memory(self) -> Batch:
        """The batch in page-locked memory (DataLoader's `pin_memory`), so `to(cuda)` copies it asynchronously."""
        return dataclasses.replace(self, **{k: getattr(self, k).pin_memory() for k in self._tensors()},
                                   audio=self.audio.pin_memory() if self.audio is not None else None)

    def halves(self) -> tuple[Batch, Batch] | None:
        """Its first and second half of utterances as two batches (what a learner short of device
        memory trains one after the other); None for a single utterance."""
        if self.size < 2:
            return None
        k, ends = self.size // 2, self.target_lengths.cumsum(0).tolist()

        def rows(part: slice, targets: slice) -> Batch:
            return Batch(feats=self.feats[part] if self.feats is not None else None,
                         feat_lengths=self.feat_lengths[part] if self.feat_lengths is not None else None,
                         targets=self.targets[targets], target_lengths=self.target_lengths[part],
                         texts=self.texts[part], ids=self.ids[part],
                         audio=self.audio.rows(part) if self.audio is not None else None)

        return rows(slice(0, k), slice(0, ends[k - 1])), rows(slice(k, None), slice(ends[k - 1], None))

    def featurized(self, features: DeviceFeatures) -> Batch:
        """The batch with its features computed from its `audio` by `features`, where the audio is."""
        if self.audio is None:
            return self
        feats, lengths = features(self.audio)
        return dataclasses.replace(self, feats=feats, feat_lengths=lengths, audio=None)


def padded_batch(feats: list[torch.Tensor], texts: list[str], ids: list[str], tokenizer,
                 audio: AudioBatch | None = None) -> Batch | None:
    """Utterances' features (or, with `audio`, the waveforms whose features are left to compute)
    and transcripts as one padded batch with the tokenizer's targets; None for none."""
    if not ids:
        return None
    targets = [tokenizer.encode(text) for text in texts]
    return Batch(
        feats=torch.nn.utils.rnn.pad_sequence(feats, batch_first=True) if audio is None else None,
        feat_lengths=torch.tensor([len(f) for f in feats]) if audio is None else None,
        targets=torch.cat(targets),
        target_lengths=torch.tensor([len(t) for t in targets]),
        texts=[tokenizer.normalize(text) for text in texts],
        ids=list(ids),
        audio=audio,
    )
