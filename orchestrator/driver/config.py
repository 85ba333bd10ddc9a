"""The job spec: pydantic models over YAML, with `--set section.key=value` overrides.

Every section has defaults; an unknown key, a value of the wrong type, a number that is not finite
(`.nan`, `.inf`) or a data path that does not exist fails `load_spec` with a `SpecError` that names
the file and the key, before anything is started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.groups.spec import GroupConfig
from orchestrator.workload import workload_config


class SpecError(ValueError):
    """A job spec that cannot run; the message names the file and the key."""


class BudgetConfig(BaseModel):
    """The `budget` section: how long the job trains and how often it evaluates.

    Args:
    epochs: passes over the training data (the job stops at whichever limit comes first).
    wall_seconds: wall-clock limit of the training loop.
    eval_every_epochs: evaluate on `dev` after every this many epochs.
    eval_every_seconds: also evaluate whenever this many seconds passed since the last evaluation.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    epochs: int | None = Field(20, ge=1)
    wall_seconds: float | None = Field(None, gt=0)
    eval_every_epochs: int = Field(1, ge=1)
    eval_every_seconds: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _some_limit(self) -> BudgetConfig:
        if self.epochs is None and self.wall_seconds is None:
            raise ValueError("set epochs or wall_seconds (or both)")
        return self


class LearnersConfig(BaseModel):
    """How many learners: the job starts once `min` are placed and grows to `max` as capacity
    appears; below `min` (learners lost, no capacity) it waits up to `wait_timeout_s` seconds for
    more, then gives up. A plain integer in the spec means a fixed size (min = max).

    A learner that is alive but completes no step for `max(stuck_after_s, stuck_step_multiple x
    its median step time)` while computing (or that stops answering for as long) is declared
    stuck: it is killed, dropped and its slot asked for again; the rest go on.

    Args:
        min: the fewest learners the job trains with: it starts once this many are placed and
            answer, and pauses to wait whenever it has fewer.
        max: the most learners: the job asks for this many slots from the start and grows to it
            as capacity appears (a lost learner's slot is asked for again). Left out, it is `min`.
        wait_timeout_s: how long the job waits below `min` (at the start, or after losing
            learners) before it gives up with an error that says what it waited for.
        stuck_after_s: the shortest time a learner may compute one step (or not answer) before it
            counts as stuck; the bound is the larger of this and `stuck_step_multiple` x its median
            step time.
        stuck_step_multiple: the stuck bound in the learner's own median step times, so a slow
            model's long steps are not taken for a hang.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    min: int = Field(1, ge=1)
    max: int = Field(1, ge=1)
    wait_timeout_s: float = Field(600.0, gt=0)
    stuck_after_s: float = Field(30.0, gt=0)
    stuck_step_multiple: float = Field(20.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _plain_count(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return {"min": value, "max": value}
        if isinstance(value, dict) and "max" not in value and isinstance(value.get("min"), int):
            return {**value, "max": value["min"]}
        return value

    @model_validator(mode="after")
    def _ordered(self) -> LearnersConfig:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self

    @property
    def fixed(self) -> bool:
        return self.min == self.max


class SimulateConfig(BaseModel):
    """Test and benchmark aids, never needed in production.

    slowdown: learner index -> factor (>= 1) that stretches each of that learner's compute steps
        (it sleeps factor - 1 times as long as it computed), to imitate a slower GPU on one machine.
        Indices are learner ids: the first learners placed are 0..max-1; a learner that replaces
        a lost one gets a new id and runs at full speed.
    nan_loss_at_step: test only: the learners placed at the start make their loss NaN at this
        step (once each), to exercise the rollback of a non-finite loss (`optim.max_rollbacks`).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    slowdown: dict[int, float] = Field(default_factory=dict)
    nan_loss_at_step: int | None = Field(None, ge=0)

    @field_validator("slowdown")
    @classmethod
    def _factors(cls, value: dict[int, float]) -> dict[int, float]:
        for index, factor in value.items():
            if index < 0:
                raise ValueError(f"learner index {index} is negative")
            if factor < 1.0:
                raise ValueError(f"learner {index}: factor {factor} is below 1 (it can only slow a learner down)")
        return value


class JobSpec(BaseModel):
    """A training job: the orchestrator's sections (budget, learners, group, seed, ...) and, in
    `workload_config`, the sections of the workload named by `workload` (`orchestrator.workload`;
    `asr` by default: data, features, model, optim). In YAML the workload's sections sit at the
    top level beside the others, and `spec.data` reads `spec.workload_config.data`.

    Args:
        workload: what is trained, by its registered name (`orchestrator.workload`): `asr`, speech
            recognition (sections `data`, `features`, `model`, `optim`), or `linear`, a linear
            classifier on random tensors (sections `data`, `optim`; no corpus needed).
        workload_config: not a key of the YAML: the workload's sections, written at the top level
            of the spec (listed below under the workload's name).
        name: names the run: its output folder (`runs/<name>` by default), its Ray actors and
            placement groups (`<name>-<suffix>/learner-<id>`) and its metrics' `chorus_job` tag.
        budget: when training stops and how often the job evaluates.
        learners: how many learners, and when a learner counts as stuck.
        cpus_per_learner: each learner's CPU reservation on Ray (default 1; fractions share a
            core); a one-learner job run without Ray uses all of this machine's cores unless it
            is set.
        accelerator: each learner asks for a GPU (`gpu`), none (`cpu`: its process sees no CUDA
            device, whatever the node has), or (`auto`) a GPU when the cluster has one or its
            autoscaler can launch a node type that has one.
        gpus_per_learner: the share of a GPU each learner reserves when it asks for one (default
            1; 0.5 puts two learners on each GPU, as Ray Train's `resources_per_worker`).
        service_gpus: the share of a GPU the job's service reserves to evaluate on (0, the default:
            it evaluates on the CPU and sees no GPU; in a one-learner job, which evaluates in the
            driver's process, anything above 0 lets it use the GPU that process sees).
        learner_resources: custom resources added to each learner's reservation (e.g. `{V100: 1}`
            to keep learners on the nodes that advertise it).
        accelerator_types: custom resources naming interchangeable node kinds (e.g. `[V100, A10G]`,
            as `cluster.yaml`'s GPU types advertise): each learner asks for one unit of one of
            them, the learners spread evenly over them, and the summary reports each kind's
            learners and speed.
        group: how the learners keep their models in agreement (`group.kind`) and whether the
            group adapts to their measured speeds.
        seed: seeds the initial weights (every learner starts from the same), the data's shuffling
            and sharding, and gossip's choice of partners.
        simulate: test and benchmark aids, never needed in production.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    workload: str = "asr"
    workload_config: SerializeAsAny[BaseModel]
    name: str = Field("chorus", pattern=r"^[A-Za-z0-9_.-]+$", max_length=200)
    budget: BudgetConfig = BudgetConfig()
    learners: LearnersConfig = LearnersConfig()
    cpus_per_learner: float | None = Field(None, gt=0)
    accelerator: Literal["auto", "gpu", "cpu"] = "auto"
    gpus_per_learner: float | None = Field(None, gt=0, le=1)
    service_gpus: float = Field(0.0, ge=0, le=1)
    learner_resources: dict[str, float] = Field(default_factory=dict)
    accelerator_types: list[str] = Field(default_factory=list)
    group: GroupConfig = GroupConfig()
    seed: int = Field(0, ge=0)
    simulate: SimulateConfig = SimulateConfig()

    @model_validator(mode="before")
    @classmethod
    def _gather_workload_sections(cls, raw: Any) -> Any:
        """The workload's sections, given at the top level, become `workload_config`."""
        if not isinstance(raw, dict) or "workload_config" in raw:
            return raw
        try:
            fields = workload_config(raw.get("workload", "asr")).model_fields
        except (KeyError, TypeError):
            return raw  # `workload`'s own check names it
        raw = dict(raw)
        raw["workload_config"] = {k: raw.pop(k) for k in list(raw) if k in fields}
        return raw

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, name: str) -> str:
        try:
            workload_config(name)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        return name

    @field_validator("workload_config", mode="before")
    @classmethod
    def _workload_section(cls, value: Any, info: ValidationInfo) -> BaseModel:
        if "workload" not in info.data:
            raise ValueError("no sections of an unknown workload")
        config = workload_config(info.data["workload"])
        return value if isinstance(value, config) else config.model_validate(value, context=info.context)

    @model_serializer(mode="wrap")
    def _flat(self, handler) -> dict:
        """Dumped as written: the workload's sections at the top level."""
        out = handler(self)
        if isinstance(out, dict) and isinstance(out.get("workload_config"), dict):
            section = out.pop("workload_config")
            out = {**out, **section}
        return out

    def __getattr__(self, name: str) -> Any:
        section = self.__dict__.get("workload_config")
        if section is not None and name in type(section).model_fields:
            return getattr(section, name)
        return super().__getattr__(name)

    @field_validator("name")
    @classmethod
    def _one_folder(cls, name: str) -> str:
        if set(name) == {"."}:
            raise ValueError("must not be '.', '..' or other dots only (it names a folder: runs/<name>)")
        return name

    @field_validator("learner_resources")
    @classmethod
    def _custom_only(cls, value: dict[str, float]) -> dict[str, float]:
        for key, amount in value.items():
            if key in ("CPU", "GPU"):
                raise ValueError(f"{key} is set by {'cpus_per_learner' if key == 'CPU' else 'accelerator'}, "
                                 "not learner_resources")
            if amount < 0:
                raise ValueError(f"{key}: {amount} is negative")
        return value

    @model_validator(mode="after")
    def _gpus_need_an_accelerator(self) -> JobSpec:
        if self.gpus_per_learner is not None and self.accelerator == "cpu":
            raise ValueError(f"gpus_per_learner is {self.gpus_per_learner:g} but accelerator is cpu: "
                             "set accelerator: gpu (or auto), or leave gpus_per_learner out")
        return self

    @model_validator(mode="after")
    def _types_apart(self) -> JobSpec:
        both = sorted(set(self.accelerator_types) & set(self.learner_resources))
        if both:
            raise ValueError(f"{both[0]} is in both accelerator_types and learner_resources (a learner asks "
                             "for one of accelerator_types, and for every learner_resources key)")
        if len(set(self.accelerator_types)) != len(self.accelerator_types):
            raise ValueError(f"accelerator_types lists a kind twice: {self.accelerator_types}")
        return self

    @model_validator(mode="after")
    def _slowdown_learners_exist(self) -> JobSpec:
        n = self.learners.max
        beyond = sorted(i for i in self.simulate.slowdown if i >= n)
        if beyond:
            raise ValueError(f"simulate.slowdown names learner {beyond[0]}, but the job has at most {n} "
                             f"(indices 0..{n - 1})")
        return self


def apply_overrides(raw: dict, overrides: list[str], where: str = "<spec>") -> dict:
    """Apply `a.b=c` overrides to a nested dict; values are parsed as YAML (`lr=1e-3` is a float)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"{where}: --set {item!r}: expected key=value, e.g. optim.lr=0.001")
        parts = key.strip().split(".")
        node = raw
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SpecError(f"{where}: --set {item!r}: {'.'.join(parts[:i + 1])!r} is a value, not a section")
            node = child
        node[parts[-1]] = yaml_value(value, f"{where}: --set {one_line(key.strip())}")
    return raw


def yaml_value(text: str, where: str) -> Any:
    """`text` (a `--set` value) parsed as YAML (empty: None); a SpecError naming `where` when it is not YAML."""
    if not text.strip():
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{where}: {text!r} is not a YAML value ({_yaml_problem(exc)})") from None


def one_line(text: str) -> str:
    """`text` (a key a user wrote) with what would break or garble a line escaped (`a\\nb`)."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What PyYAML says is wrong, in one line (its messages span several, with the text quoted)."""
    problem = getattr(exc, "problem", None) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _format_errors(exc: ValidationError, where: str, overridden: set[str]) -> str:
    lines = []
    for err in exc.errors():
        loc = err["loc"][1:] if err["loc"][:1] == ("workload_config",) else err["loc"]
        dotted = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        else:
            msg = err["msg"].removeprefix("Value error, ")
            shown = err.get("input")
            if err["type"] != "missing" and not isinstance(shown, dict) and str(shown) not in msg:
                msg += f" (got {shown!r})"
        origin = " (from --set)" if dotted in overridden else ""
        lines.append(f"{where}: {one_line(dotted) or '(top level)'}{origin}: {one_line(msg)}")
    return "\n".join(lines)


def parse_spec(raw: Any, where: str = "<spec>", overrides: list[str] = (), model: type[BaseModel] = JobSpec,
               check_paths: bool = True):
    """Validate a spec given as a dict (e.g. from YAML), after applying overrides. `check_paths=False`
    leaves out the checks that data paths exist (they are another machine's: `chorus submit`)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: the spec must be a mapping of sections, got {type(raw).__name__}")
    raw = apply_overrides(raw, list(overrides), where)
    try:
        return model.model_validate(raw, context={"check_paths": check_paths})
    except ValidationError as exc:
        overridden = {o.partition("=")[0].strip() for o in overrides}
        raise SpecError(_format_errors(exc, where, overridden)) from None


def load_spec(path: str | Path, overrides: list[str] = (), model: type[BaseModel] = JobSpec,
              check_paths: bool = True):
    """Read and validate a YAML spec file.

    Example:
        >>> spec = load_spec("jobs/configs/tiny.yaml", ["optim.lr=0.001", "learners=2"])
        >>> spec.optim.lr, spec.learners.max
        (0.001, 2)
    """
    return parse_spec(read_yaml(Path(path), "spec"), str(path), overrides, model, check_paths)


def read_yaml(path: Path, what: str) -> Any:
    """A YAML file's document; a SpecError in one line when there is no such file or it is not YAML."""
    if not path.is_file():
        raise SpecError(f"{path}: no such {what} file")
    try:
        return yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        problem = _yaml_problem(exc) if isinstance(exc, yaml.YAMLError) else f"not UTF-8 ({exc.reason})"
        raise SpecError(f"{path}: not valid YAML: {problem}") from None
