"""The sweep spec: which job to tune (inline, or the path of a job spec), the search space, the
method and its budget, and how big each trial is. `load_sweep` reads it from YAML with
`--set` overrides (`job.*` keys reach into the job spec) and checks everything that can be
checked before a sweep starts: the job spec, the space, and the job spec at the corners of the
space, so a typo in a parameter's key fails at once, not in the first trial.

Example:
    >>> sweep = load_sweep("search/configs/bohb_tiny.yaml")  # doctest: +SKIP
    >>> sweep.method, sweep.budget.max, sweep.learners
    ('bohb', 27, 2)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.driver.config import (
    JobSpec,
    SpecError,
    apply_overrides,
    one_line,
    parse_spec,
    read_yaml,
    yaml_value,
)
from search.space import Space

METHODS = ("bohb", "hyperband", "asha", "hyperopt", "random")
METRICS = {"dev_wer": "min", "dev_loss": "min", "train_loss": "min"}  # what every trial reports


class SweepBudget(BaseModel):
    """The sweep's `budget` section: what a trial's budget counts, and its rungs.

    Args:
    unit: what a trial's budget counts (epochs: one report to Tune per epoch).
    max: the most a trial trains (the top rung); every trial's learning-rate schedule spans it.
    min: ASHA's grace period (Hyperband and BOHB start their smallest rung at max / eta^k).
    reduction_factor: eta, the fraction 1/eta of a rung that goes on to the next.
    """

    model_config = ConfigDict(extra="forbid")
    unit: Literal["epochs"] = "epochs"
    max: int = Field(27, ge=1)
    min: int = Field(1, ge=1)
    reduction_factor: float = Field(3.0, gt=1)

    @model_validator(mode="after")
    def _ordered(self) -> SweepBudget:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self

    def rungs(self) -> list[int]:
        """The budgets at which trials are compared: min, min x eta, ... up to max."""
        out, r = [], float(self.min)
        while r < self.max - 1e-9:
            out.append(int(round(r)))
            r *= self.reduction_factor
        return out + [self.max]


class SweepSpec(BaseModel):
    """A sweep.

    Args:
        name: names the sweep's output (OUT defaults to runs/<name>).
        job: the job spec every trial starts from (validated; data paths made absolute).
        space: parameters by the job-spec key they set (`search.space.Param`).
        method: bohb | hyperband | asha | hyperopt | random.
        metric, mode: what the trials are compared by (a key of each epoch's report).
        budget: the trials' budget (`SweepBudget`).
        trials: how many configurations to try.
        max_concurrent: trials running at once.
        learners: learners per trial (each a bundle of the trial's placement group).
        learners_per_rung: rung-aware scaling: learners for a trial training in the k-th rung
            (budget.rungs()); a promoted trial resumes from its checkpoint with more learners.
        driver_cpus: CPUs reserved for each trial's driver and its job's service beside it (the
            shard planner and the evaluator of the averaged model).
        cpus_per_learner: CPUs reserved for each learner of a trial [default: the job's, else 1].
        seed: the searchers' seed.
    """

    model_config = ConfigDict(extra="forbid")
    name: str = Field("sweep", pattern=r"^[A-Za-z0-9_.-]+$")
    job: dict[str, Any]
    space: Space
    method: Literal["bohb", "hyperband", "asha", "hyperopt", "random"]
    metric: str = "dev_wer"
    mode: Literal["min", "max"] | None = None
    budget: SweepBudget = SweepBudget()
    trials: int = Field(9, ge=1)
    max_concurrent: int = Field(1, ge=1)
    learners: int = Field(1, ge=1)
    learners_per_rung: list[int] | None = None
    driver_cpus: float = Field(1.0, gt=0)
    cpus_per_learner: float | None = Field(None, gt=0)
    seed: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> SweepSpec:
        if self.mode is None:
            self.mode = METRICS.get(self.metric, "min")
        if self.learners_per_rung is not None:
            if not self.learners_per_rung or any(n < 1 for n in self.learners_per_rung):
                raise ValueError("learners_per_rung: a list of learner counts >= 1, e.g. [1, 2, 4]")
            if self.method == "random":
                raise ValueError("learners_per_rung: random search has no rungs "
                                 "(use hyperband, bohb, asha or hyperopt)")
        return self

    @property
    def learner_cpus(self) -> float:
        return self.cpus_per_learner or self.job.get("cpus_per_learner") or 1.0

    def learners_for(self, epochs_done: int) -> int:
        """Learners for a trial that has trained `epochs_done` epochs (it next trains the rung
        whose budget it has not reached yet)."""
        if self.learners_per_rung is None:
            return self.learners
        rung = sum(1 for r in self.budget.rungs() if r <= epochs_done)
        return self.learners_per_rung[min(rung, len(self.learners_per_rung) - 1)]

    def trial_spec(self, config: dict, learners: int, name: str, check_paths: bool = True) -> JobSpec:
        """The job spec of one trial: the job, the config's parameters, `learners` learners and
        the sweep's maximum budget (evaluated once per epoch, no wall limit)."""
        trial = [f"learners={learners}", f"cpus_per_learner={self.learner_cpus}",
                 f"budget.epochs={self.budget.max}", "budget.wall_seconds=null",
                 "budget.eval_every_epochs=1", "budget.eval_every_seconds=null", f"name={name}"]
        raw = yaml.safe_load(yaml.safe_dump(self.job))
        return parse_spec(raw, f"trial {name}", self.space.overrides(config) + trial, check_paths=check_paths)


def _absolute_data(job: JobSpec) -> dict:
    raw = job.model_dump(mode="json")
    for key in ("train", "dev", *job.workload_config.final_splits):
        if raw["data"].get(key) is not None:
            raw["data"][key] = str(Path(raw["data"][key]).resolve())
    return raw


def load_sweep(path: str | Path, overrides: list[str] = (), check_paths: bool = True) -> SweepSpec:
    """Read, resolve and check a sweep spec; a `SpecError` names the file and the key. With
    `check_paths=False` the job's data paths need not exist here (`chorus submit`)."""
    path = Path(path)
    raw = read_yaml(path, "sweep spec")
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: the sweep spec must be a mapping, got {type(raw).__name__}")
    job_sets = [o.strip().removeprefix("job.") for o in overrides if o.strip().startswith("job.")]
    space_sets = [o.strip().removeprefix("space.") for o in overrides if o.strip().startswith("space.")]
    others = [o for o in overrides if not o.strip().startswith(("job.", "space."))]
    raw = apply_overrides(raw, others, str(path))
    _set_space(raw, space_sets, path)
    if "job" not in raw:
        raise SpecError(f"{path}: job: missing (a job spec inline, or the path of one)")
    job_raw, job_where = raw["job"], f"{path}: job"
    if isinstance(job_raw, str):
        job_path = Path(job_raw)
        if not job_path.is_file() and (path.parent / job_raw).is_file():
            job_path = path.parent / job_raw
        job_where = f"{path}: job ({job_path})"
        try:
            job_raw = read_yaml(job_path, "job spec")
        except SpecError as exc:  # it names the job's file: say which sweep named it
            raise SpecError(f"{path}: job: {exc}") from None
    if not isinstance(job_raw, dict):
        raise SpecError(f"{job_where}: a job spec (mapping) or the path of one, got {type(job_raw).__name__}")
    job = parse_spec(job_raw, job_where, job_sets, check_paths=check_paths)
    raw["job"] = _absolute_data(job) if check_paths else job.model_dump(mode="json")
    if "method" in raw and raw["method"] not in METHODS:
        raise SpecError(f"{path}: method: unknown method {raw['method']!r} (one of: {', '.join(METHODS)})")
    if isinstance(raw.get("space"), dict) and not raw["space"]:
        raise SpecError(f"{path}: space: empty; name at least one parameter, e.g. optim.lr: "
                        "{type: float, low: 1.0e-4, high: 1.0e-2, log: true}")
    sweep = parse_spec(raw, str(path), model=SweepSpec)
    _check(sweep, path, job, check_paths)
    return sweep


PARAM_FIELDS = ("type", "low", "high", "log", "choices", "when")


def _set_space(raw: dict, overrides: list[str], path: Path) -> None:
    """`--set space.optim.lr.high=0.02` (a field of a parameter) or `--set space.optim.lr={...}`
    (a whole parameter): parameter names hold dots, so the field is the last part if it is one."""
    if not overrides:
        return
    space = raw.setdefault("space", {})
    if not isinstance(space, dict):
        raise SpecError(f"{path}: space: a mapping of parameters, got {type(space).__name__}")
    for item in overrides:
        key, sep, value = item.partition("=")
        name, _, last = key.strip().rpartition(".")
        parsed = yaml_value(value, f"{path}: --set space.{one_line(key.strip())}")
        if last in PARAM_FIELDS and name:
            if not isinstance(space.get(name), dict):
                raise SpecError(f"{path}: --set space.{one_line(key.strip())}: the space has no parameter {name!r} "
                                f"(it has: {', '.join(one_line(str(k)) for k in space) or 'none'})")
            space[name][last] = parsed
        else:
            space[key.strip()] = parsed


def _check(sweep: SweepSpec, path: Path, job: JobSpec, check_paths: bool) -> None:
    if sweep.metric not in METRICS:
        raise SpecError(f"{path}: metric: {sweep.metric!r} is not reported by trials (one of: {', '.join(METRICS)})")
    splits = job.workload_config.eval_splits()
    if sweep.metric.startswith("dev_") and "dev" not in splits:
        raise SpecError(f"{path}: metric: {sweep.metric} needs a dev split in the job (asr: data.dev); it has none")
    for corner, config in zip(("low", "high"), sweep.space.corners(), strict=True):
        try:
            sweep.trial_spec(config, sweep.learners, "check", check_paths)
        except SpecError as exc:
            detail = str(exc).replace("trial check: ", "parameter ").replace(" (from --set)", "")
            raise SpecError(f"{path}: space: the job spec with every parameter at its {corner} end "
                            f"is not valid:\n{detail}") from None
