"""The search space: one YAML definition of hyperparameters (floats and integers, optionally on a
log scale, categoricals, and conditions on a categorical parent) and its translations — to a
ConfigSpace space (BOHB), a hyperopt space (HyperOptSearch) and a Ray Tune space (random search,
Hyperband, ASHA) — plus turning a sampled config into `--set` overrides of the job spec.

A parameter's name is the dotted job-spec key it sets (`optim.lr`). A conditional parameter
(`when: {model.kind: conformer_ctc}`) is a real condition in ConfigSpace; hyperopt and Tune
sample it always and `overrides()` leaves it out when its condition does not hold, which gives
it the same distribution whenever it is active.

Example:
    >>> space = Space.model_validate({"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
    ...                               "model.hidden": {"type": "categorical", "choices": [96, 160]}})
    >>> space.overrides({"optim.lr": 0.003, "model.hidden": 96})
    ['optim.lr=0.003', 'model.hidden=96']
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, model_validator


class Param(BaseModel):
    """One hyperparameter.

    Args:
        type: float | int | categorical.
        low, high: bounds (float and int; both included).
        log: sample on a log scale (float and int; both bounds must be positive).
        choices: the values of a categorical.
        when: {parent: value or [values]}: the parameter only applies when the categorical
            parent (another parameter of the space) has one of these values.
    """

    model_config = ConfigDict(extra="forbid")
    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: list[Any] | None = None
    when: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Param:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical needs a non-empty list of choices")
            if self.low is not None or self.high is not None or self.log:
                raise ValueError("a categorical takes choices, not low/high/log")
            if len({repr(c) for c in self.choices}) != len(self.choices):
                raise ValueError(f"choices repeat a value: {self.choices}")
            return self
        if self.choices is not None:
            raise ValueError(f"a {self.type} takes low and high, not choices")
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} needs low and high")
        if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError(f"an int needs whole bounds, got low={self.low:g}, high={self.high:g}")
        if self.low >= self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-scale range must be positive, got low={self.low:g}")
        return self

    def condition_values(self) -> tuple[str, list] | None:
        if not self.when:
            return None
        (parent, values), = self.when.items()
        return parent, values if isinstance(values, list) else [values]


class Space(RootModel[dict[str, Param]]):
    """Parameters by the job-spec key they set."""

    root: dict[str, Param] = Field(min_length=1)

    @model_validator(mode="after")
    def _conditions(self) -> Space:
        for name, p in self.root.items():
            if p.when is None:
                continue
            if len(p.when) != 1:
                raise ValueError(f"{name}: when: names one parent parameter, got {list(p.when)}")
            parent, values = p.condition_values()
            if parent not in self.root or self.root[parent].type != "categorical":
                raise ValueError(f"{name}: when: {parent} must be a categorical parameter of the space")
            unknown = [v for v in values if v not in self.root[parent].choices]
            if unknown:
                raise ValueError(f"{name}: when: {parent} has no choice {unknown[0]!r} "
                                 f"(choices: {self.root[parent].choices})")
        return self

    def items(self):
        return self.root.items()

    # -- translations ---------------------------------------------------------------------------
    def to_configspace(self, seed: int | None = None):
        """A ConfigSpace space (ConfigSpace 1.x: no quantization; integers are Integer)."""
        from ConfigSpace import Categorical, ConfigurationSpace, EqualsCondition, Float, InCondition, Integer

        cs = ConfigurationSpace(seed=seed)
        hps = {}
        for name, p in self.items():
            if p.type == "float":
                hps[name] = Float(name, bounds=(p.low, p.high), log=p.log)
            elif p.type == "int":
                hps[name] = Integer(name, bounds=(int(p.low), int(p.high)), log=p.log)
            else:
                hps[name] = Categorical(name, items=p.choices)
        cs.add(list(hps.values()))
        for name, p in self.items():
            if p.when:
                parent, values = p.condition_values()
                cs.add(EqualsCondition(hps[name], hps[parent], values[0]) if len(values) == 1
                       else InCondition(hps[name], hps[parent], values))
        return cs

    def to_hyperopt(self) -> dict:
        """A hyperopt space (a dict of `hp` expressions)."""
        from hyperopt import hp
        from hyperopt.pyll import scope

        out = {}
        for name, p in self.items():
            if p.type == "float":
                out[name] = (hp.loguniform(name, math.log(p.low), math.log(p.high)) if p.log
                             else hp.uniform(name, p.low, p.high))
            elif p.type == "int":
                # round(uniform(low - 0.5, high + 0.5)) gives every integer the same weight
                # (hyperopt's uniformint, a quniform over [low, high], halves the two ends); on a
                # log scale, floor(loguniform(low, high + 1)) as Tune's lograndint
                low, high = int(p.low), int(p.high)
                out[name] = scope.int(hp.loguniform(name, math.log(low), math.log(high + 1)) if p.log
                                      else hp.quniform(name, low - 0.5, high + 0.5, 1))
            else:
                out[name] = hp.choice(name, p.choices)
        return out

    def to_tune(self) -> dict:
        """A Ray Tune param space."""
        from ray import tune

        out = {}
        for name, p in self.items():
            if p.type == "float":
                out[name] = tune.loguniform(p.low, p.high) if p.log else tune.uniform(p.low, p.high)
            elif p.type == "int":  # Tune's randint excludes the upper bound
                out[name] = (tune.lograndint(int(p.low), int(p.high) + 1) if p.log
                             else tune.randint(int(p.low), int(p.high) + 1))
            else:
                out[name] = tune.choice(p.choices)
        return out

    # -- configs --------------------------------------------------------------------------------
    def active(self, config: dict) -> dict:
        """The config's parameters whose conditions hold (all, for an unconditional space),
        values cast to the parameter's type as plain Python values."""
        out = {}
        for name, p in self.items():
            if name not in config:
                continue
            cond = p.condition_values()
            if cond and config.get(cond[0]) not in cond[1]:
                continue
            value = config[name]
            if hasattr(value, "item"):  # a numpy scalar (ConfigSpace's samples): a plain Python value
                value = value.item()
            if p.type == "int":  # within the bounds (a sample at an open end rounds onto them)
                value = min(max(int(round(value)), int(p.low)), int(p.high))
            out[name] = float(value) if p.type == "float" else value
        return out

    def overrides(self, config: dict) -> list[str]:
        """`key=value` overrides of the job spec for a sampled config."""
        return [f"{name}={_yaml_value(value)}" for name, value in self.active(config).items()]

    def corners(self) -> list[dict]:
        """Configs at the low and at the high ends (first and last choices) of every parameter:
        what a spec check validates against the job spec before a sweep starts."""
        lows, highs = {}, {}
        for name, p in self.items():
            lows[name], highs[name] = (p.choices[0], p.choices[-1]) if p.type == "categorical" else (p.low, p.high)
        return [self.active(lows), self.active(highs)]


def _yaml_value(value: Any) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()
