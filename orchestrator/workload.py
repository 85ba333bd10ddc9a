"""The Workload protocol — all the orchestrator knows of what is trained — and the registry that
names the implementations (`asr`: speech recognition, `jobs/workload.py`; `linear`: a linear
classifier on random tensors, `jobs/linear.py`, for tests about orchestration and for trying a
cluster without audio). The registry is the orchestrator's only way into `jobs/`: it imports an
implementation by its dotted path when a job asks for it.

A job spec names its workload (`workload: asr`, the default) and holds the workload's own
sections (`Workload.Config`'s fields: for `asr`, `data`, `features`, `model`, `optim`) beside the
orchestrator's (`budget`, `learners`, `group`, ...).

Example:
    >>> cls = workload_class("linear")
    >>> w = cls(cls.Config(), seed=0)
    >>> model = w.build_model(); opt = w.build_optimizer(model)
    >>> batch = next(iter(w.batches(rank=0, world_size=1, epoch=0)))
    >>> w.loss(model, batch).backward()
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

if TYPE_CHECKING:
    import torch

# each workload's class, and its spec section (`config`: a pydantic model in a module that imports
# no torch, so validating a spec does not load the workload)
REGISTRY: dict[str, dict[str, str]] = {
    "asr": {"workload": "jobs.workload:AsrWorkload", "config": "jobs.sections:WorkloadConfig",
            "commands": "jobs.commands:COMMANDS", "recognizer": "jobs.recognizer:SpeechRecognizer",
            "transcriber": "jobs.transcription:ClipTranscriber", "exporter": "jobs.export:export"},
    "linear": {"workload": "jobs.linear:LinearWorkload", "config": "jobs.sections:LinearConfig"},
}


class Batch(Protocol):
    """A batch; `size` samples (what shares and sample counts count). It may also have `halves()`:
    itself as two batches, None for one sample (a learner short of device memory trains those,
    `orchestrator/learner/memory_fit.py`; a batch without it is skipped there instead)."""

    size: int


class ShardBatches(Protocol):
    """One shard's batches of one epoch; `position` counts the planned batches handed out so far."""

    position: int

    def __iter__(self) -> Iterable[Batch]: ...


class WorkloadSection(Protocol):
    """A workload's section of a job spec (a pydantic model, `Workload.Config`): besides its fields,
    `final_splits`, the splits scored once at the end on the model evaluated last (`dev` is the one
    scored while training), and which splits this spec has. Both are read without importing the
    workload (a sweep's spec is checked so)."""

    final_splits: tuple[str, ...]

    def eval_splits(self) -> list[str]:
        """Which splits this spec has: `dev` and any of `final_splits`."""


class Workload(Protocol):
    """What the orchestrator asks of a workload. `Config` is its pydantic section of the spec (a
    `WorkloadSection`); `input_error` the exception its data problems raise (the CLI reports it in
    one line); `max_rollbacks` how often a job may roll back a non-finite loss before it gives up."""

    Config: type[BaseModel]
    input_error: type[Exception]
    max_rollbacks: int

    def __init__(self, config: BaseModel, seed: int = 0): ...

    def check_data(self) -> None: ...

    def build_model(self) -> torch.nn.Module: ...

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer: ...

    def batches(self, rank: int, world_size: int, epoch: int, start: int = 0,
                weights: list[float] | None = None) -> ShardBatches: ...

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor: ...

    def optimizer_step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int,
                       progress: float, lr_scale: float = 1.0) -> float: ...

    def evaluate(self, model: torch.nn.Module, split: str) -> dict | None:
        """{"wer": error rate in percent or None, "loss": ..., "utterances": samples scored} on
        `dev` or one of its section's `final_splits`, or None when the spec has no such split."""

    def state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict: ...

    def load_state_dict(self, state: dict, model: torch.nn.Module,
                        optimizer: torch.optim.Optimizer | None = None) -> None: ...

    def new_skips(self) -> dict[str, str]:
        """Training inputs skipped here since the last call (what -> reason)."""

    def add_skips(self, skips: dict[str, str]) -> None: ...

    def skip_counts(self) -> dict[str, int]: ...


def workload_part(name: str, part: str) -> Any:
    """A part the workload `name` registered beyond its class: `recognizer` (a trained model put to
    use: `from_checkpoint(state, ...)`, `orchestrator.Recognizer`), `transcriber` (what `chorus
    transcribe` runs over batches of inputs), `exporter` (`chorus export`: `export(state, folder)`).
    A KeyError names what is missing."""
    return _load(name, part)


def _load(name: str, part: str) -> Any:
    entry = REGISTRY.get(name)
    if entry is None:
        raise KeyError(f"unknown workload {name!r} (known: {', '.join(sorted(REGISTRY))})")
    if part not in entry:
        raise KeyError(f"workload {name!r} has no {part}")
    module, _, attr = entry[part].partition(":")
    return getattr(importlib.import_module(module), attr)


def workload_class(name: str) -> type[Workload]:
    """The registered workload class called `name`."""
    return _load(name, "workload")


def workload_config(name: str) -> type[BaseModel]:
    """The spec section of the workload called `name` (its class's `Config`), without importing
    the workload where the registry names the section's own module."""
    return _load(name, "config") if "config" in REGISTRY.get(name, {}) else workload_class(name).Config


def workload_commands() -> list:
    """The commands the registered workloads add to `chorus` (their `commands` part: a list of
    click commands, e.g. `asr`'s data tools `synth`, `features`, `shards` and `lm`)."""
    return [command for name, entry in REGISTRY.items() if "commands" in entry
            for command in _load(name, "commands")]


def build_workload(name: str, config: dict | BaseModel, seed: int) -> Workload:
    """The workload `name` over its section of a spec (a dict, as sent to a learner, or its model)."""
    cls = workload_class(name)
    return cls(config if isinstance(config, BaseModel) else cls.Config.model_validate(config), seed=seed)


def register(name: str, workload: str, **parts: str) -> None:
    """Add a workload: `workload` is `module:Class`; it must be importable on every node. A
    `config="module:Model"` part names its spec section where that module is lighter to import;
    `commands="module:LIST"` the click commands it adds to `chorus`; `recognizer` and `transcriber`
    what uses its trained models (`workload_part`)."""
    REGISTRY[name] = {"workload": workload, **parts}
