"""The sweep methods as Ray Tune searchers and schedulers:

| method    | searcher                          | scheduler                          |
|-----------|-----------------------------------|------------------------------------|
| bohb      | TuneBOHB (ConfigSpace space)      | HyperBandForBOHB (brackets filled) |
| hyperband | random (BasicVariantGenerator)    | HyperBandScheduler (one fill each) |
| asha      | random                            | ASHAScheduler                      |
| hyperopt  | HyperOptSearch (hyperopt space)   | ASHAScheduler                      |
| random    | random                            | none: every trial trains max budget |

Every scheduler counts a trial's budget in Tune's `training_iteration` (one report per epoch).
`max_concurrent` limits running trials through the searcher (TuneBOHB's own limit, which does
not count paused trials; a ConcurrencyLimiter for HyperOpt; the random generator's limit, except
under Hyperband, which pauses trials: there the cluster's capacity bounds it).
`TuneBOHB` is given metric and mode itself: it ignores TuneConfig's when it has its own space.
With `learners_per_rung`, the scheduler is wrapped in (a subclass of) Tune's
`ResourceChangingScheduler`, which gives a trial the learners of the rung it trains next.
"""

from __future__ import annotations

from dataclasses import dataclass

from search.spec import SweepSpec


@dataclass
class Method:
    """What `Tuner` needs from a method: a searcher, a scheduler and the param space (None when
    the searcher holds the space itself)."""

    search_alg: object
    scheduler: object
    param_space: dict | None


def build_method(sweep: SweepSpec, trial_resources=None) -> Method:
    """The searcher and scheduler of `sweep.method`; `trial_resources(learners)` makes a trial's
    PlacementGroupFactory (needed for rung-aware scaling)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter

    metric, mode, b = sweep.metric, sweep.mode, sweep.budget
    param_space = None
    match sweep.method:
        case "bohb":
            from ray.tune.search.bohb import TuneBOHB

            # TuneBOHB limits the trials it runs itself (a ConcurrencyLimiter would count paused ones)
            searcher = TuneBOHB(space=sweep.space.to_configspace(seed=sweep.seed), metric=metric, mode=mode,
                                seed=sweep.seed, max_concurrent=sweep.max_concurrent)
            scheduler = _filled_brackets_bohb()(time_attr="training_iteration", metric=metric, mode=mode,
                                                max_t=b.max, reduction_factor=b.reduction_factor,
                                                stop_last_trials=True)
        case "hyperopt":
            from ray.tune.search.hyperopt import HyperOptSearch

            searcher = ConcurrencyLimiter(HyperOptSearch(space=sweep.space.to_hyperopt(), metric=metric, mode=mode,
                                                         random_state_seed=sweep.seed,
                                                         n_initial_points=min(20, max(3, sweep.trials // 4))),
                                          max_concurrent=sweep.max_concurrent)
            scheduler = ASHAScheduler(time_attr="training_iteration", metric=metric, mode=mode, max_t=b.max,
                                      grace_period=b.min, reduction_factor=b.reduction_factor)
        case "hyperband":
            # random configs; Hyperband pauses trials, which a limit would count as running, so
            # the cluster's capacity alone bounds how many run at once
            searcher, param_space = BasicVariantGenerator(random_state=sweep.seed, max_concurrent=0), \
                sweep.space.to_tune()
            scheduler = _hyperband()(time_attr="training_iteration", metric=metric, mode=mode, max_t=b.max,
                                     reduction_factor=b.reduction_factor)
        case _:  # random configs, stopped early by ASHA or run to the end
            searcher = BasicVariantGenerator(random_state=sweep.seed, max_concurrent=sweep.max_concurrent)
            param_space = sweep.space.to_tune()
            scheduler = ASHAScheduler(time_attr="training_iteration", metric=metric, mode=mode, max_t=b.max,
                                      grace_period=b.min, reduction_factor=b.reduction_factor) \
                if sweep.method == "asha" else FIFOScheduler()
    if sweep.learners_per_rung is not None and trial_resources is not None:
        scheduler = _rung_scaling(sweep, scheduler, trial_resources)
    return Method(searcher, scheduler, param_space)


def _accepting(bracket) -> bool:
    """Whether a Hyperband bracket still takes new trials: until it has been given its n0."""
    return bracket is not None and getattr(bracket, "chorus_added", 0) < bracket._n0


class _OneFillPerBracket:
    """Tune's Hyperband brackets take new trials whenever fewer are live than their current size,
    so a bracket whose trials have finished takes new ones at its top rung: after its first
    bracket, Tune's HyperBandForBOHB trained every new trial for the full budget (random search
    with extra steps). Here a bracket takes exactly its n0 trials, then the band's next bracket
    is opened. (Tune internals, checked against the pinned Ray: `_state`, `_n0`.)"""

    def on_trial_add(self, tune_controller, trial):
        if self._state["bracket"] is not None and not _accepting(self._state["bracket"]):
            self._state["bracket"] = None  # the parent opens the next bracket
        super().on_trial_add(tune_controller, trial)
        bracket = self._state["bracket"]
        bracket.chorus_added = getattr(bracket, "chorus_added", 0) + 1


def _hyperband():
    from ray.tune.schedulers import HyperBandScheduler

    class Hyperband(_OneFillPerBracket, HyperBandScheduler):
        """Tune's HyperBandScheduler, each bracket filled once."""

    return Hyperband


def _filled_brackets_bohb():
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import HyperBandForBOHB

    class FilledBracketsBOHB(_OneFillPerBracket, HyperBandForBOHB):
        """Tune's HyperBandForBOHB, each bracket filled once, and not halved before it is filled
        while the searcher can still add trials to it. Tune's version halves any bracket whenever
        no trial is running, which happens between one trial pausing and the next being
        suggested: with one trial at a time, each bracket's first trial was promoted alone, on
        the strength of nothing (bohb_tiny's first trial went on to rung 3 before a second one
        had started)."""

        def choose_trial_to_run(self, tune_controller, allow_recurse: bool = True):
            waiting = (_accepting(self._state["bracket"]) and not tune_controller.search_alg.is_finished()
                       and not any(t.status == Trial.RUNNING for t in tune_controller.get_trials()))
            if not waiting:
                return super().choose_trial_to_run(tune_controller, allow_recurse)
            for band in self._hyperbands:  # what the parent runs first: pending or promoted trials
                for b in (b for b in band if b is not None):
                    for trial in b.current_trials():
                        if trial.status == Trial.PENDING or (trial.status == Trial.PAUSED
                                                             and trial in b.trials_to_unpause):
                            return trial
            return None  # the searcher's next trial fills the bracket

    return FilledBracketsBOHB


def _rung_scaling(sweep: SweepSpec, base, trial_resources):
    from ray.tune.schedulers import TrialScheduler
    from ray.tune.schedulers.resource_changing_scheduler import ResourceChangingScheduler

    def allocate(controller, trial, result, scheduler):
        """The resources of the rung the trial trains next (None: keep what it has)."""
        wanted = trial_resources(sweep.learners_for(int(result.get("training_iteration", 0))))
        return None if wanted == trial.placement_group_factory else wanted

    class RungScaling(ResourceChangingScheduler):
        """Tune's ResourceChangingScheduler, changing a trial's resources when its scheduler
        pauses it at a rung (it resumes with them once promoted), not only when it continues:
        Hyperband pauses every trial at a rung. A trial that must stop to grow is also marked
        for Hyperband to choose again (Hyperband only resumes trials it paused itself)."""

        def on_trial_result(self, controller, trial, result):
            decision = self._base_scheduler.on_trial_result(controller, trial, result)
            if decision == TrialScheduler.STOP:
                return decision
            wanted = allocate(controller, trial, result, self)
            if wanted is None:
                return decision
            self._trials_to_reallocate[trial] = wanted
            if decision == TrialScheduler.CONTINUE:
                bracket = getattr(self._base_scheduler, "_trial_info", {}).get(trial)
                if bracket is not None and hasattr(bracket[0], "trials_to_unpause"):
                    bracket[0].trials_to_unpause.add(trial)
                return TrialScheduler.PAUSE
            return decision

    return RungScaling(base_scheduler=base, resources_allocation_function=allocate)
