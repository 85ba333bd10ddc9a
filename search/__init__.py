"""The Tune layer: sweep specs (`spec`), search spaces translated to ConfigSpace, hyperopt and
Tune (`space`), the methods' searchers and schedulers (`methods`), trials that are distributed
`TrainingJob`s (`trial`) and running, resuming and summarizing a sweep (`sweep`)."""

from search.space import Param, Space
from search.spec import SweepBudget, SweepSpec, load_sweep
from search.sweep import SweepError, run_sweep

__all__ = ["Param", "Space", "SweepBudget", "SweepError", "SweepSpec", "load_sweep", "run_sweep"]
