"""The ASR workload behind the small interface the orchestrator drives, knowing nothing of speech:
build a model and optimizer, iterate a shard's batches for (rank, world_size, epoch), the loss of a
batch, evaluate a model on a corpus, and save/load state.

Example:
    >>> w = AsrWorkload(WorkloadConfig(data={"train": "corpus/train.jsonl"}), seed=0)
    >>> model = w.build_model(); opt = w.build_optimizer(model)
    >>> for batch in w.batches(rank=0, world_size=1, epoch=0):
    ...     opt.zero_grad(); w.loss(model, batch).backward(); opt.step()
    >>> w.evaluate(model, "corpus/test.jsonl")  # {'wer': ..., 'loss': ..., 'utterances': ...}

Data it cannot use is refused by name (`jobs.data.manifests.DataError`): `check_data` before a job places
anything, `batches` on a learner's node that sees no training data or can read none of its shard.
"""

from __future__ import annotations

import math
import os
import socket
import threading
from pathlib import Path

import torch

from jobs.data.batch import Batch
from jobs.data.corpus import WARPS_ADVICE, WARPS_NEED_AUDIO, Corpus, ShardBatches
from jobs.data.manifests import DataError
from jobs.data.pipeline import FeatureCache
from jobs.data.shard_stream import ShardStream, StreamCorpus, is_shard_source
from jobs.decode import Decoder, DecodingAssets
from jobs.features.augment import Augment
from jobs.features.device import DeviceFeatures
from jobs.features.filterbanks import Fbank, SpecAugment
from jobs.inference import chunks_by_budget, device_of, posteriors
from jobs.models import build_model, ctc_loss
from jobs.sections import EVAL_SPLITS, OptimConfig, WorkloadConfig
from jobs.tokenizer import BpeTokenizer, CharTokenizer, build_tokenizer, output_size, tokenizer_from_state
from jobs.wer import character_error_rate, word_error_rate

ONEDNN_PRIMITIVES = "32"  # oneDNN's CPU kernels (LSTM, convolutions) the process keeps, one per input shape:
# every batch has a new (utterances, frames) shape, and its default of 1,024 grew a learner through its
# first epoch (figures: bench/README.md, "Figures behind constants"). Read by oneDNN when it first runs a
# kernel; a user's own ONEDNN_PRIMITIVE_CACHE_CAPACITY wins.


def model_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """A model's (and optimizer's) state, as a workload's `state_dict` returns it."""
    state = {"model": model.state_dict()}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    return state


def load_model_state(state: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """`model_state`'s inverse (the optimizer's part only when both are there)."""
    model.load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])


class AsrWorkload:
    """CTC speech recognition (characters or BPE subwords) on one corpus; the orchestrator's only
    view of speech (it implements `orchestrator.workload.Workload`, registered as `asr`). Every
    learner learns the same BPE units from the same training transcripts, as it cuts the same
    shards from them; a resumed learner and `chorus eval` take the units its checkpoint carries."""

    Config, input_error = WorkloadConfig, DataError

    def __init__(self, config: WorkloadConfig, seed: int = 0):
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_PRIMITIVES)
        self.config, self.seed = config, seed
        self._tokenizer: CharTokenizer | BpeTokenizer | None = None
        self._tokenizer_lock = threading.Lock()  # the prefetch thread and the step's may both ask first
        self.decoding = DecodingAssets(config.decoding, lambda: sorted(
            {w for text in self.train.texts() for w in self.tokenizer.normalize(text).split()}))
        self._decoder: Decoder | None = None
        self.augment = Augment(config.augment, seed)
        self.fbank = Fbank(config.features.num_mel_bins)
        self.spec_augment = SpecAugment(config.features)
        self.device_features = DeviceFeatures(self.fbank)
        self.cache = FeatureCache(config.data.cache_mb * 2**20)  # every split's features, one bound
        self._corpora: dict[Path, Corpus] = {}
        self._skips_reported = 0  # of the training corpus's skips, those `new_skips` returned

    def corpus(self, source: str | Path) -> Corpus | StreamCorpus:
        """The corpus at `source`: a manifest's, a LibriSpeech folder's, a features folder's, or
        (training only) audio shards' at a folder or URI, streamed (`jobs.data.shard_stream`)."""
        key = _source_key(source)
        if key not in self._corpora:
            train = key == _source_key(self.config.data.train)  # augmented, and featurized on the device
            kind = StreamCorpus if is_shard_source(source) else Corpus
            if kind is StreamCorpus and not train:
                raise DataError(f"{source}: audio shards are a training source; evaluate on a manifest or folder")
            self._corpora[key] = kind(
                source, self.fbank, lambda: self.tokenizer, self.config.data.max_utterance_seconds,
                **({"cache": self.cache} if kind is Corpus else {"shard_features": self.config.data.shard_features}),
                augment=self.augment if train else None, on_device=train and _on_device(self.config))
        return self._corpora[key]

    @property
    def tokenizer(self) -> CharTokenizer | BpeTokenizer:
        """`model.tokenizer`'s tokenizer: the one a loaded checkpoint carried, or else one made now
        (BPE: trained from the training transcripts, the same on every learner)."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                self._tokenizer = build_tokenizer(self.config.model.tokenizer, self.train.tokenizer_texts())
            return self._tokenizer

    @property
    def lexicon(self) -> list[str]:
        """The words a lexicon decoder may output: those a loaded checkpoint carried, or else the
        training transcripts' (normalized)."""
        return self.decoding.lexicon()

    def decode(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        """A batch's texts, decoded as `decoding` says (greedy, or through `lexicon`, and an `lm`)."""
        if self._decoder is None:
            self._decoder = self.decoding.decoder(self.tokenizer)
        return self._decoder(log_probs, lengths)

    @property
    def train(self) -> Corpus:
        return self.corpus(self.config.data.train)

    def check_data(self) -> None:
        """Raise a DataError naming the first split of the spec (train, then `EVAL_SPLITS`) that has
        no usable utterance, with its skip reasons: before a job places anything."""
        d = self.config.data
        for what, source in [("training", d.train)] + [(split, getattr(d, split)) for split in EVAL_SPLITS]:
            if source is not None:
                corpus = self.corpus(source)
                if not len(corpus):
                    raise DataError(f"no usable {what} utterances in {source}: {corpus.skipped.describe()}")
                if what not in {"training", "dev"} and corpus.shards is not None and \
                        any(w != 1.0 for w in self.config.decoding.warps or []):
                    raise DataError(f"{WARPS_NEED_AUDIO}: data.{what} ({source}) is a features folder; {WARPS_ADVICE}")
        try:
            self.tokenizer  # noqa: B018 - a BPE model is learnt here first, so a corpus it cannot learn from stops the job now
        except ValueError as exc:
            raise DataError(f"model.tokenizer: cannot learn BPE units from {d.train}: {exc}") from None
        self.decoding.check()  # a missing or malformed language model stops the job now, not at its first evaluation

    @property
    def max_rollbacks(self) -> int:
        return self.config.optim.max_rollbacks

    def skip_counts(self) -> dict[str, int]:
        """Training utterances skipped, by reason."""
        return dict(self.train.skipped.counts)

    def new_skips(self) -> dict[str, str]:
        """Training utterances skipped here since the last call (what -> reason): what a learner
        reports to its driver, whose `add_skips` merges them into the job's count."""
        corpus = self._corpora.get(_source_key(self.config.data.train))
        if corpus is None:
            return {}
        skips = corpus.skipped.since(self._skips_reported)
        self._skips_reported = len(corpus.skipped.items)
        return skips

    def add_skips(self, skips: dict[str, str]) -> None:
        """Count another reader's (a learner's) training skips, each file once."""
        if skips:
            self.train.skipped.merge(skips)

    def build_model(self) -> torch.nn.Module:
        torch.manual_seed(self.seed)
        cfg = self.config
        return build_model(cfg.model, cfg.features.num_mel_bins, output_size(cfg.model.tokenizer))

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        o = self.config.optim
        return torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)

    def learning_rate(self, step: int, progress: float) -> float:
        return scheduled_lr(self.config.optim, step, progress)

    def optimizer_step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int,
                       progress: float, lr_scale: float = 1.0) -> float:
        """Clip gradients, set the scheduled rate (times `lr_scale`) and step; returns the gradient norm."""
        clip = self.config.optim.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))
        for group in optimizer.param_groups:
            group["lr"] = self.learning_rate(step, progress) * lr_scale
        optimizer.step()
        return float(norm)

    def batches(self, rank: int, world_size: int, epoch: int, start: int = 0,
                weights: list[float] | None = None) -> ShardBatches | ShardStream:
        """This rank's batches of one epoch from planned batch (a stream's: utterance) `start` on, loading
        audio as it goes; `weights` (one per rank) size the shards unequally (`Corpus`'s, `StreamCorpus`'s)."""
        corpus = self.train
        if not len(corpus):  # this node sees none of what the driver checked
            raise DataError(f"no usable training utterances in {corpus.source} on host {socket.gethostname()}: "
                            f"{corpus.skipped.describe()}")
        return corpus.batches(rank, world_size, epoch, self.seed, self.config.data, start, weights)

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        """Mean per-utterance CTC loss; SpecAugment is applied when the model is in training mode.
        The batch moves to the model's device."""
        batch = batch.to(device_of(model)).featurized(self.device_features)
        feats = self.spec_augment(batch.feats) if model.training else batch.feats
        with self.autocast(model):
            log_probs, out_lengths = model(feats, batch.feat_lengths)
        return ctc_loss(log_probs.float(), out_lengths, batch.targets, batch.target_lengths)

    def autocast(self, model: torch.nn.Module) -> torch.autocast:
        """The model's forward pass in its precision (`model.precision`): bfloat16 autocast, or none."""
        return torch.autocast(device_of(model).type, dtype=torch.bfloat16,
                              enabled=self.config.model.precision == "bf16")

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, source: str | Path) -> dict | None:
        """WER (percent), mean loss and utterance count of `model` on a corpus: one of the spec's
        splits by name (one of `EVAL_SPLITS`; None when the spec has none) or a manifest."""
        warps = self.config.decoding.warps if source != "dev" and self.config.decoding.warps else [1.0]
        if source in EVAL_SPLITS:
            source = getattr(self.config.data, str(source))
            if source is None:
                return None
        corpus = self.corpus(source)
        was_training = model.training
        model.eval()
        refs, hyps, loss_sum, n = [], [], 0.0, 0
        order = sorted(range(len(corpus)), key=lambda i: corpus.utterances[i].duration)
        budget = self.config.data.max_batch_seconds
        for chunk in chunks_by_budget(order, corpus.durations, budget):
            readings = corpus.warped(chunk, warps)
            if readings is None:  # no utterance of the chunk readable
                continue
            batch, log_probs, out_lengths = posteriors(model, readings, self.autocast)
            loss_sum += ctc_loss(log_probs, out_lengths, batch.targets, batch.target_lengths).item() * batch.size
            hyps += self.decode(log_probs, out_lengths)
            refs += batch.texts
            n += batch.size
        model.train(was_training)
        return {"wer": word_error_rate(refs, hyps) if n else None, "loss": loss_sum / n if n else None,
                "utterances": n, "skipped": corpus.skipped.total,
                "cer": character_error_rate(refs, hyps) if n else None}

    def state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
        """The model's (and optimizer's) state and the tokenizer's, so a checkpoint decodes with its own
        units (and, decoding through a lexicon, its words; with a language model, that model)."""
        return {**model_state(model, optimizer), "tokenizer": self.tokenizer.state(), **self.decoding.state()}

    def load_state_dict(self, state: dict, model: torch.nn.Module,
                        optimizer: torch.optim.Optimizer | None = None) -> None:
        load_model_state(state, model, optimizer)
        self._decoder = None  # the next decode() builds one with what the checkpoint carries
        self.decoding.load(state)
        if "tokenizer" in state:
            with self._tokenizer_lock:
                self._tokenizer = tokenizer_from_state(state["tokenizer"])
        elif self.config.model.tokenizer.kind != "char":  # checkpoints from before tokenizers were saved are char ones
            raise DataError("this checkpoint carries no BPE units: it was not trained with model.tokenizer.kind: bpe")


def scheduled_lr(o: OptimConfig, step: int, progress: float) -> float:
    """Rate for optimizer step `step` when `progress` (0..1) of the budget is spent: linear warm-up,
    then constant or cosine decay to `lr * min_lr_ratio`."""
    warm = min(1.0, (step + 1) / max(1, o.warmup_steps))
    if o.schedule == "constant":
        return o.lr * warm
    decay = o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, max(0.0, progress))))
    return o.lr * warm * decay


def _source_key(source: str | Path) -> str | Path:
    """What names a data source once: a URI as written, a path resolved."""
    return str(source) if "://" in str(source) else Path(source).resolve()


def _on_device(config: WorkloadConfig) -> bool:
    """Whether training features are computed on the learner's device (`features.compute_on`;
    `auto`: when this process sees a GPU, which is hidden from learners that reserved none)."""
    return config.features.compute_on == "device" or config.features.compute_on == "auto" and torch.cuda.is_available()


