"""The job spec's sections that each workload owns, as pydantic models: `WorkloadConfig` (the
`asr` workload's `data`, `features`, `model`, `optim`) and `LinearConfig` (the `linear`
workload's `data`, `optim`). They import neither torch nor the workloads, so a spec validates
(`chorus submit`, `chorus jobs ...`, the docs generator) in a process that never trains; the
workloads (`jobs/workload.py`, `jobs/linear.py`) read them.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

EVAL_SPLITS = ("dev", "test", "test_unseen", "test_unseen_engine")  # the data keys evaluated, in this order


class DataConfig(BaseModel):
    """The `data` section of an ASR job: its splits, batching and input pipeline.

    Args:
    train, dev, test, test_unseen, test_unseen_engine: a `.jsonl` manifest, a Lhotse CutSet manifest
        (`.jsonl.gz`), a LibriSpeech-layout directory or a features directory (`chorus features`:
        filterbanks computed once) each; all but `train` may be left out. `train` may also be audio
        shards (`chorus shards`) or a Lhotse Shar directory (`chorus shards --format lhotse-shar`)
        at a folder or a URI (`s3://bucket/corpus?endpoint_override=host:port`): each learner
        streams the shards planned for it, and nothing reads the whole corpus. `test_unseen` is meant for voices
        never heard in training, `test_unseen_engine` for speech from a synthesizer (or recording
        setup) never heard in training.
    max_batch_seconds: padded audio seconds per batch (utterances x longest in the batch).
    max_utterance_seconds: a longer utterance is skipped (counted, never loaded), which bounds
        the memory one utterance takes.
    cache_mb: the features a learner keeps in memory (all splits together, least recently used
        out first); what is not kept is decoded again when next read.
    prefetch_batches: batches prepared ahead of the step in a background thread (audio decode,
        filterbanks, padding); 0 prepares each one when the step asks for it. With `workers`, the
        batches each worker prepares ahead.
    shard_features: train on the log-mel power that audio shards carry (`chorus shards --features`)
        instead of decoding their audio and computing filterbanks; augmentation is then applied in
        the log-mel domain (`jobs.features.mel_augment`, an approximation of the waveform's).
    workers: processes that prepare training batches in parallel (`jobs.data.worker_batches`); 0
        prepares them in the learner's process. Each keeps a feature cache of `cache_mb`. Unset: one
        per CPU of the learner's but one when its step runs on a GPU, else 0 (a CPU learner's step
        uses all its CPUs).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    train: Path | str  # a URI (`s3://...`) stays a string
    dev: Path | None = None
    test: Path | None = None
    test_unseen: Path | None = None
    test_unseen_engine: Path | None = None
    max_batch_seconds: float = 60.0
    max_utterance_seconds: float = Field(60.0, gt=0)
    cache_mb: float = Field(1024.0, gt=0)
    prefetch_batches: int = Field(2, ge=0)
    shard_features: bool = False
    workers: int | None = Field(None, ge=0)

    @field_validator("train", *EVAL_SPLITS)
    @classmethod
    def _exists(cls, path: Path | str | None, info: ValidationInfo) -> Path | str | None:
        if path is None or "://" in str(path):  # audio shards at a URI: opened (and checked) by check_data
            return None if path is None else str(path)
        path = Path(path)
        if not (info.context or {}).get("check_paths", True):  # paths of another machine
            return path
        if not path.exists():
            raise ValueError(f"no such manifest or directory: '{path}'")
        if path.is_file() and path.suffix != ".jsonl" and not path.name.endswith(".jsonl.gz"):
            raise ValueError(f"'{path}' is neither a .jsonl manifest, a Lhotse CutSet (.jsonl.gz) nor a LibriSpeech-"
                             "layout, features or Lhotse Shar directory")
        return path

    @field_validator("max_batch_seconds")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be > 0")
        return v


class FeatureConfig(BaseModel):
    """The `features` section: the filterbanks, where they are computed, and the augmentation.

    Args:
    num_mel_bins: filterbank channels.
    freq_mask: widest frequency mask (bins) of SpecAugment; 0 turns it off.
    time_mask: widest time mask (frames) of SpecAugment; 0 turns it off.
    num_freq_masks, num_time_masks: how many masks of each kind per utterance.
    compute_on: where training batches' filterbanks and waveform augmentation are computed:
        `device`: batched where the learner's model is (its GPU), from audio the input path
        decodes and augmentation it draws there (`jobs/features/device.py`); `cpu`: per
        utterance in the input path, cached when nothing is augmented; `auto`: `device` when the
        learner sees a GPU, else `cpu`. Evaluation and features folders always use the CPU path.
    """

    model_config = ConfigDict(extra="forbid")
    num_mel_bins: int = Field(80, ge=8, le=256)
    freq_mask: int = Field(15, ge=0)
    time_mask: int = Field(20, ge=0)
    num_freq_masks: int = Field(2, ge=0)
    num_time_masks: int = Field(2, ge=0)
    compute_on: Literal["auto", "cpu", "device"] = "auto"


class AugmentConfig(BaseModel):
    """Waveform augmentation of training utterances, drawn anew each epoch from (seed, epoch,
    utterance) alone; evaluation never sees it (`jobs/features/augment.py`). Every kind is off by default.

    Args:
        speed_factors: speed perturbation: each utterance is resampled by one factor drawn from
            these (tempo and pitch change together, as Kaldi's and ESPnet's recipes do), e.g.
            `[0.9, 1.0, 1.1]`; empty turns it off. A factor below 1 lengthens the utterance, so a
            batch may hold up to `1 / min(factor)` times `data.max_batch_seconds` of audio.
        noise_prob: the chance that an utterance gets additive white noise.
        noise_snr_db: `[low, high]`: its signal-to-noise ratio in dB, drawn uniformly.
        reverb_prob: the chance that an utterance is convolved with a synthetic room impulse
            response (exponentially decaying noise after a direct path).
        reverb_rt60_s: `[low, high]`: that room's reverberation time (60 dB decay) in seconds.
        vtlp_warp: `[low, high]`: vocal tract length perturbation (Jaitly and Hinton, 2013): the
            filterbank reads each utterance's spectrum at frequencies scaled by a factor drawn
            uniformly from this range (formants move, tempo and pitch stay), e.g. `[0.8, 1.2]`;
            null turns it off.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    speed_factors: list[float] = Field(default_factory=list)
    noise_prob: float = Field(0.0, ge=0, le=1)
    noise_snr_db: tuple[float, float] = (10.0, 30.0)
    reverb_prob: float = Field(0.0, ge=0, le=1)
    reverb_rt60_s: tuple[float, float] = (0.2, 0.8)
    vtlp_warp: tuple[float, float] | None = None

    @field_validator("speed_factors")
    @classmethod
    def _factors(cls, factors: list[float]) -> list[float]:
        if any(not 0.5 <= f <= 2.0 for f in factors):
            raise ValueError(f"speed factors must lie in [0.5, 2.0], got {factors}")
        return factors

    @field_validator("noise_snr_db", "reverb_rt60_s", "vtlp_warp")
    @classmethod
    def _range(cls, bounds: tuple[float, float] | None) -> tuple[float, float] | None:
        if bounds is not None and bounds[0] > bounds[1]:
            raise ValueError(f"expected [low, high] with low <= high, got {list(bounds)}")
        return bounds

    @field_validator("reverb_rt60_s")
    @classmethod
    def _positive_rt60(cls, bounds: tuple[float, float]) -> tuple[float, float]:
        if bounds[0] <= 0:
            raise ValueError(f"reverberation times must be > 0 s, got {list(bounds)}")
        return bounds

    @field_validator("vtlp_warp")
    @classmethod
    def _warp_factors(cls, bounds: tuple[float, float] | None) -> tuple[float, float] | None:
        if bounds is not None and not (0.5 <= bounds[0] and bounds[1] <= 2.0):
            raise ValueError(f"VTLP warp factors must lie in [0.5, 2.0], got {list(bounds)}")
        return bounds

    @property
    def enabled(self) -> bool:
        return bool(self.speed_factors) or self.noise_prob > 0 or self.reverb_prob > 0 or self.vtlp_warp is not None


class TokenizerConfig(BaseModel):
    """The `tokenizer` section: characters or BPE units.

    Args:
    kind: `char` (letters, apostrophe and space) or `bpe` (SentencePiece byte-pair encoding,
        trained from the training transcripts when the job starts and saved with its checkpoints).
    vocab: the BPE vocabulary's size at most (a corpus with fewer distinct pieces gets fewer);
        the model's output layer has `vocab + 1` classes, CTC's blank included.
    """

    model_config = ConfigDict(extra="forbid")
    kind: Literal["char", "bpe"] = "char"
    vocab: int = Field(128, ge=32, le=32_000)  # SentencePiece needs a piece for each character first


class ModelConfig(BaseModel):
    """The `model` section: the acoustic model's kind and size.

    Args:
    kind: `bilstm_ctc` or `conformer_ctc`.
    subsample_channels: channels of the two stride-2 convolutions.
    d_model: width after subsampling (the LSTM input, or the Conformer's model width).
    hidden: LSTM hidden size per direction (bilstm_ctc).
    layers: LSTM layers or Conformer blocks.
    heads, ffn_dim, conv_kernel: Conformer attention heads, feed-forward width, depthwise kernel.
    dropout: dropout inside the encoder.
    precision: the arithmetic of forward and backward passes: `fp32`, or `bf16` (mixed precision:
        the model runs under bfloat16 autocast while its weights, gradients, optimizer state and the
        CTC loss stay float32; what GPUs from A100 on run fastest, and no loss scaling is needed).
    tokenizer: the units the model emits: characters, or BPE subwords.
    """

    model_config = ConfigDict(extra="forbid")
    kind: Literal["bilstm_ctc", "conformer_ctc"] = "bilstm_ctc"
    subsample_channels: int = Field(32, ge=1)
    d_model: int = Field(144, ge=1)
    hidden: int = Field(160, ge=1)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    ffn_dim: int = Field(576, ge=1)
    conv_kernel: int = Field(15, ge=1)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    precision: Literal["fp32", "bf16"] = "fp32"
    tokenizer: TokenizerConfig = TokenizerConfig()


class OptimConfig(BaseModel):
    """The `optim` section: optimizer, learning-rate schedule, precision and rollbacks.

    Args:
    lr: peak learning rate of AdamW.
    weight_decay: AdamW's decoupled weight decay.
    warmup_steps: linear warm-up from 0 to `lr` over this many optimizer steps.
    schedule: after warm-up, `cosine` decays to `lr * min_lr_ratio` over the job's budget
        (epochs or wall seconds, whichever the job reports as progress); `constant` keeps `lr`.
    min_lr_ratio: the floor of the cosine schedule, as a fraction of `lr`.
    grad_clip: clip the global gradient norm to this (0 turns clipping off).
    max_rollbacks: when the training loss turns NaN or infinite, the job rolls every learner back
        to its last checkpoint and halves the learning rate, at most this many times; then it
        stops with an error (0: stop at the first non-finite loss).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    lr: float = Field(2e-3, gt=0)
    weight_decay: float = Field(1e-2, ge=0)
    warmup_steps: int = Field(100, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = Field(0.05, ge=0, le=1)
    grad_clip: float = Field(5.0, ge=0)
    max_rollbacks: int = Field(3, ge=0)


class DecodingConfig(BaseModel):
    """How CTC outputs become words in evaluation (`jobs/decode.py`).

    Args:
        kind: `greedy` (the best unit per frame, repeats collapsed, blanks dropped: any string of
            units) or `lexicon` (flashlight's beam search through torchaudio's `ctc_decoder`, with
            no language model: a hypothesis is a sequence of words of the training transcripts,
            each spelled in the model's units; the word list is saved with checkpoints) or `lm`
            (the same search, its hypotheses also scored by the word n-gram model in `lm`).
        beam: hypotheses kept per frame (`lexicon`, `lm`).
        beam_tokens: units a hypothesis may grow by per frame, the most likely first (`lexicon`,
            `lm`); null: every unit. With BPE's hundreds of units and a language model each growth
            costs a score, so a few dozen keep the search fast (bench/README, "Open vocabulary").
        beam_threshold: hypotheses scoring further than this below the frame's best are dropped.
        word_score: added to a hypothesis's log-probability per word (`lexicon`): above 0 favours
            more words, below 0 fewer.
        lm: an ARPA file of a word n-gram model (`chorus lm`), for `kind: lm`.
        lm_weight: the language model's log-probability's weight against the acoustic model's (`lm`).
        warps: test-time augmentation: each evaluated utterance is read at these VTLP warp factors
            (`augment.vtlp_warp`'s filterbank warp, e.g. `[0.8, 0.9, 1.0, 1.1, 1.2]`) and the model's
            per-frame posteriors averaged before decoding (the reported loss is the averaged
            posteriors'); one forward pass per warp. Applies to every evaluation (the test splits
            at the end, `chorus eval`) but `dev`'s, whose passes while training come out of the wall
            budget. Needs the test splits' audio, not a features folder. Null: one unwarped pass.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    kind: Literal["greedy", "lexicon", "lm"] = "greedy"
    beam: int = Field(10, ge=1)
    beam_tokens: int | None = Field(None, ge=1)
    beam_threshold: float = Field(50.0, gt=0)
    word_score: float = 0.0
    lm: str | None = None
    lm_weight: float = Field(0.5, ge=0)
    warps: list[float] | None = Field(None, min_length=1)

    @field_validator("warps")
    @classmethod
    def _warp_factors(cls, warps: list[float] | None) -> list[float] | None:
        if warps is not None and any(not 0.5 <= w <= 2.0 for w in warps):
            raise ValueError(f"warp factors must lie in [0.5, 2.0], got {warps}")
        return warps

    @property
    def uses_lexicon(self) -> bool:
        """Whether decoding needs a word list (which checkpoints then carry)."""
        return self.kind in {"lexicon", "lm"}

    @model_validator(mode="after")
    def _lm_named(self) -> DecodingConfig:
        if self.kind in {"lm"} and not self.lm:  # (a decoding kind, not a group's: tests/test_structure.py)
            raise ValueError("decoding.kind is lm but decoding.lm names no ARPA file (make one with `chorus lm`)")
        return self


class WorkloadConfig(BaseModel):
    """The ASR workload's part of a job spec (`workload: asr`, the default).

    Args:
        data: the corpus's splits and how batches are cut.
        features: log-mel filterbanks and SpecAugment.
        augment: speed, noise, reverberation and vocal tract length of training audio.
        model: the recognizer (BiLSTM or Conformer, CTC) and its units.
        optim: AdamW, its schedule, clipping and rollbacks.
        decoding: greedy, or a beam search constrained to the training transcripts' words.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    final_splits: ClassVar[tuple[str, ...]] = EVAL_SPLITS[1:]  # scored at the end; dev while training
    data: DataConfig
    features: FeatureConfig = FeatureConfig()
    augment: AugmentConfig = AugmentConfig()
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    decoding: DecodingConfig = DecodingConfig()

    def eval_splits(self) -> list[str]:
        """The evaluation splits this spec names (of `EVAL_SPLITS`)."""
        return [split for split in EVAL_SPLITS if getattr(self.data, split) is not None]


class LinearData(BaseModel):
    """The `data` section of the `linear` workload: random samples.

    Args:
    samples: training samples (eval splits have a quarter as many each).
    features: input dimensions.
    classes: output classes.
    batch_size: samples per batch (of one learner, with equal shares).
    eval_splits: which of `dev`, `test`, `test_unseen`, `test_unseen_engine` exist.
    compute_seconds: each batch's loss takes at least this long (sleeping, not computing): a
        stand-in for a real model's step time, so orchestration tests have steps of a realistic
        length without loading a busy machine.
    eval_seconds: each split's evaluation takes at least this long (sleeping): a stand-in for a
        real model's dev pass, so tests can have evaluations slower than an epoch.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    samples: int = Field(512, ge=1)
    features: int = Field(16, ge=1)
    classes: int = Field(4, ge=2)
    batch_size: int = Field(16, ge=1)
    eval_splits: list[str] = Field(default_factory=lambda: ["dev", "test"])
    compute_seconds: float = Field(0.0, ge=0)
    eval_seconds: float = Field(0.0, ge=0)


class LinearModel(BaseModel):
    """The `model` section of the `linear` workload.

    Args:
    hidden_layers: square `features` x `features` layers (each followed by a ReLU) before the
        output layer; 0 is softmax regression. Deeper models give benchmarks gradients that
        arrive layer by layer (bench/transport.py's overlapped allreduce).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    hidden_layers: int = Field(0, ge=0)


class LinearOptim(BaseModel):
    """The `optim` section of the `linear` workload.

    Args:
    lr: SGD's learning rate.
    max_rollbacks: rollbacks of a non-finite loss before the job gives up.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    lr: float = Field(0.1, gt=0)
    max_rollbacks: int = Field(3, ge=0)


class LinearConfig(BaseModel):
    """The linear workload's part of a job spec (`workload: linear`).

    Args:
        data: the random samples, their batches and the simulated step time.
        model: the classifier's depth.
        optim: SGD's rate and the rollbacks of a non-finite loss.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    final_splits: ClassVar[tuple[str, ...]] = EVAL_SPLITS[1:]  # scored at the end; dev while training
    data: LinearData = LinearData()
    model: LinearModel = LinearModel()
    optim: LinearOptim = LinearOptim()

    def eval_splits(self) -> list[str]:
        """The evaluation splits this spec names (`data.eval_splits`)."""
        return list(self.data.eval_splits)
