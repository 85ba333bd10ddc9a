"""TrainLoop: drives the learners in chunks of steps (`run(steps)` on each learner) until the
budget is spent, taking membership changes in between. Two schedulers: lockstep (a collective
group, or one learner here: every learner runs a chunk, the round ends when all are back, the
driver decides when to stop) and free-running (gossip, hierarchical: a learner — or a node's
learners together — gets its next chunk as soon as its last is back, with the job's deadline).

Between chunks it polls for newcomers and drains, retires leavers, waits below `learners.min`,
swaps or re-forms the group on a change, drops stuck or dead learners, rebalances at epoch
boundaries and starts an evaluation when one is due. It gets the parts it drives (`LoopParts`),
not the job: what an evaluation does is the snapshots' (`snapshot.py`), what a rollback is the
rollbacks' decision (`rollback.py`) that the loop carries out, and the job books each chunk's
report (`job.observe`) and forms the group (`job.form_group`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.checkpoint.job_checkpoint import load_entry
from orchestrator.driver.watchdog import HEARTBEAT_EVERY_S

if TYPE_CHECKING:
    from orchestrator.driver.config import BudgetConfig
    from orchestrator.driver.elastic import Elastic
    from orchestrator.driver.group import Group
    from orchestrator.driver.recovery import RecoveryLog
    from orchestrator.driver.rollback import Rollbacks
    from orchestrator.driver.roster import Roster
    from orchestrator.driver.snapshots import Snapshots
    from orchestrator.driver.watchdog import Watchdog

CHUNK_STEPS = 8  # steps per `run` call: how often the driver looks at budget and evaluations
CHUNK_SECONDS = 10.0  # ... or after this long, whichever comes first (slow steps: a slow link, a big model)
ROUND_LEARNERS = 16  # a lockstep round of more learners runs longer chunks (CHUNK_STEPS per 16 learners):
# the driver's work between rounds (gathering every answer, sending every call) grows with the
# learners, and all of them wait for it, so the round grows with it and the waiting stays a flat share
QUEUED_CHUNKS = 2  # chunks a lone free-running learner has in flight: its next waits in its actor's
# queue behind the one it runs, so it never waits for the driver between chunks (with 32 learners
# the driver takes a while to get round to each one's answer)
UNRESPONSIVE_S = 5.0  # a round's member that neither finishes nor answers a ping this long after a
# collective broke is taken for dead (its node may be gone before Ray has declared it dead)


@dataclass(frozen=True)
class LoopParts:
    """What the training loop drives, each part built by the job (`job.py`).

    Args:
    runtime: where the learners run (`orchestrator/cluster/runtime.py`).
    roster, elastic, group, watchdog, recovery, rollbacks: who is in the job, membership changes,
        the learner group, the stuck-learner watch, the recovery log, the rollback policy.
    snapshots: evaluations and checkpoints (`begin` one, `poll` for one in flight).
    latest: the run's newest checkpoint file (a `TrainingDiverged` names it).
    observe: the job's bookkeeping of one learner's chunk report; returns its mean loss.
    form_group: (re-)form the group, dropping learners that die meanwhile.
    stop_requested, interrupted: whether the job was asked to stop early, or interrupted (Ctrl-C).
    """

    runtime: Any
    roster: Roster
    elastic: Elastic
    group: Group
    watchdog: Watchdog
    recovery: RecoveryLog
    rollbacks: Rollbacks
    snapshots: Snapshots
    latest: Path
    observe: Callable[[int, dict], float | None]
    form_group: Callable[[], None]
    stop_requested: Callable[[], bool]
    interrupted: Callable[[], bool]


class TrainLoop:
    """Drives the job's learners in chunks of steps until its budget is spent.

    Args: parts (`LoopParts`); budget (the spec's); start (time.time() the training began; earlier
    for a resumed run: its wall so far).
    """

    def __init__(self, parts: LoopParts, budget: BudgetConfig, start: float):
        self.parts, self.start, self.budget = parts, start, budget
        self.deadline = start + budget.wall_seconds if budget.wall_seconds is not None else None
        self.pending: dict = {}  # run ref -> learner id
        self.reform = False  # a collective group changed: re-form it once every learner is between chunks
        self.losses: list[tuple[float, int]] = []  # (a chunk's mean loss, its steps) since the last evaluation
        self.first_loss: float | None = None

    def progress(self) -> float:
        fractions = []
        if self.budget.epochs is not None:
            epochs = self.parts.roster.epochs()
            fractions.append(sum(epochs) / len(epochs) / self.budget.epochs)
        if self.deadline is not None:
            fractions.append((time.time() - self.start) / self.budget.wall_seconds)
        return min(1.0, max(fractions))

    def done(self, stats: dict) -> bool:
        out_of_time = self.deadline is not None and time.time() >= self.deadline
        return epochs_spent(self.budget, stats.get("epoch", 0)) or out_of_time or self.parts.stop_requested()

    def run(self) -> float:
        """Train until the budget is spent; returns the training wall seconds."""
        parts, roster = self.parts, self.parts.roster
        take_counters(parts)
        last_epoch = min(roster.epochs())
        next_eval = (last_epoch // self.budget.eval_every_epochs + 1) * self.budget.eval_every_epochs
        last_eval = time.time()
        while True:
            self._between_chunks()
            if parts.group.lockstep:
                if not roster.live or all(self.done(s.stats) for s in roster.live.values()):
                    break
                results, failed = self._round()
            else:
                self._dispatch_free()
                if not self.pending:
                    if self.reform:
                        continue
                    break
                results, failed = self._any_back()
            if not self._take(results, failed):
                continue
            epoch_now = min(roster.epochs())
            if epoch_now > last_epoch:  # at every epoch boundary: adapt to the speeds measured
                last_epoch = epoch_now
                parts.group.rebalance()
            epoch_due = epoch_now >= next_eval  # of this epoch's weights: it waits for the one in flight
            due = (epoch_due or clock_due(self.budget, last_eval)) and not epochs_spent(self.budget, epoch_now)
            if due and self.losses:
                parts.snapshots.begin(mean_loss(self.losses), self.start, wait=epoch_due)
                self.losses, last_eval = [], time.time()
                next_eval = (epoch_now // self.budget.eval_every_epochs + 1) * self.budget.eval_every_epochs
        self.drain()
        return time.time() - self.start

    def _between_chunks(self) -> None:
        """Membership changes: newcomers, drains, leavers, the minimum; the group swapped or re-formed."""
        parts, elastic = self.parts, self.parts.elastic
        if parts.interrupted():
            raise KeyboardInterrupt
        parts.snapshots.poll()  # an evaluation and checkpoint that is done: its record and manifest
        elastic.poll()
        elastic.check_drains()
        elastic.retire_leaving(set(self.pending.values()), parts.group.handover)
        if elastic.below_min():
            self.drain()
            elastic.wait_for_min()
        if parts.recovery.opened(parts.roster.take_changes()):
            if parts.group.swaps_running:  # the kind swaps its members in at once (e.g. a new ring)
                parts.group.form()
                parts.recovery.regrouped()
            else:
                self.reform = True
        if self.reform and not self.pending:
            parts.form_group()
            parts.recovery.regrouped()
            self.reform = False

    def _take(self, results: list, failed: list) -> bool:
        """A round's or chunk's answers; returns whether the loop may look at evaluations now."""
        parts = self.parts
        if parts.rollbacks.diverged(results):  # a non-finite loss: back to the last checkpoint at half the rate
            parts.snapshots.poll(wait=True)  # one in flight is written only if its weights were still finite
            for learner_id, error in failed:
                parts.elastic.drop(learner_id, error)
            self.drain()  # every learner between chunks
            self.reform = roll_back(parts, results) or self.reform
            self.losses = []
            return False
        for learner_id, stats in results:
            if stats.get("leaving"):
                parts.elastic.leaving(learner_id, stats["leaving"])
            loss = parts.observe(learner_id, stats)
            if loss is not None:
                self.losses.append((loss, len(stats["step_seconds"])))
                self.first_loss = loss if self.first_loss is None else self.first_loss
            if stats.get("broken"):
                self.reform = True
        for learner_id, error in failed:
            self._forget(learner_id)
            parts.elastic.drop(learner_id, error)
        return bool(parts.roster.live) and not self.reform and not parts.roster.changes

    def _forget(self, learner_id: int) -> None:
        """A learner's chunks still queued (it is being dropped: they would only fail)."""
        self.pending = {ref: i for ref, i in self.pending.items() if i != learner_id}

    def _dispatch(self, slot) -> None:
        """The learner's next chunk: at most so many steps or CHUNK_SECONDS, ending by the
        deadline (the members of a collective agree on the step at which they end it)."""
        steps = chunk_steps(self.parts.group.lockstep, len(self.parts.roster), bool(self.parts.roster.arriving))
        ref = slot.handle.run.remote(steps, self.deadline, self.budget.epochs, self.progress(), CHUNK_SECONDS)
        self.pending[ref] = slot.id

    def _dispatch_free(self) -> None:
        """Free-running learners get their next chunks (a lone one: QUEUED_CHUNKS in flight). The
        learners of one dispatch unit (e.g. a hierarchical node's) share a collective: they run one
        chunk at a time, together (same steps, ending at the same step), or one left out would keep
        its peers waiting."""
        if self.reform:
            return
        in_flight, roster = Counter(self.pending.values()), self.parts.roster
        for unit in self.parts.group.dispatch_units():
            slots = [roster.live[i] for i in unit]
            depth = QUEUED_CHUNKS if len(slots) == 1 else 1  # a node's learners: one chunk at a time, together
            while slots and all(in_flight[s.id] < depth and s.in_group and not s.leaving and not self.done(s.stats)
                      for s in slots):
                for slot in slots:
                    self._dispatch(slot)
                    in_flight[slot.id] += 1

    def _any_back(self) -> tuple[list, list]:
        """Every chunk back once one is (within a second, or when a newcomer answers), all at once
        so a failed chunk never queues behind the others' answers; stuck learners dropped."""
        runtime, refs = self.parts.runtime, list(self.pending) + self.parts.elastic.watched()
        ready = runtime.wait(refs, num_returns=1, timeout=1.0) and runtime.wait(refs, len(refs), timeout=0)
        answers = runtime.gather_ready(self.pending, ready)
        self.drop_stuck()
        return answers

    def _round(self) -> tuple[list, list]:
        """A lockstep round: every learner runs a chunk; all answers. Once some members report
        their collective broken, the others get UNRESPONSIVE_S to finish; one that neither
        finishes nor answers a ping is reported as failed (its process or node is gone), without
        waiting for Ray's node failure detection. Until then stuck members are looked for every
        few seconds."""
        runtime, roster = self.parts.runtime, self.parts.roster
        for slot in roster.slots():
            self._dispatch(slot)
        if not runtime.distributed:
            return runtime.gather(self.pending)
        results, failed = [], []
        while self.pending:
            broken = failed or any(stats.get("broken") for _, stats in results)
            ready = runtime.wait(list(self.pending), timeout=UNRESPONSIVE_S if broken else HEARTBEAT_EVERY_S)
            if not ready and not broken:
                self.drop_stuck()
                continue
            if not ready:
                for ref, learner_id in [(r, i) for r, i in self.pending.items()
                                        if not runtime.answers(roster.get(i) and roster.get(i).handle)]:
                    del self.pending[ref]
                    failed.append((learner_id, RuntimeError(
                        f"no answer {UNRESPONSIVE_S:g} s after its group's collective broke (node unreachable?)")))
                continue
            done_results, done_failed = runtime.gather_ready(self.pending, ready)
            results += done_results
            failed += done_failed
        return results, failed

    def drain(self) -> None:
        """Let every running chunk finish (the learners are then between chunks); a learner that
        is stuck meanwhile is dropped."""
        runtime = self.parts.runtime
        while self.pending:
            ready = runtime.wait(list(self.pending), num_returns=1, timeout=HEARTBEAT_EVERY_S)
            results, failed = runtime.gather_ready(self.pending, ready)
            self.drop_stuck()
            for learner_id, stats in results:
                self.parts.observe(learner_id, stats)
            for learner_id, error in failed:
                self.parts.elastic.drop(learner_id, error)

    def drop_stuck(self) -> None:
        """Drop (kill, free, ask again for) the running learners the watchdog finds stuck."""
        parts = self.parts
        if not parts.runtime.distributed:
            return
        running = {i: parts.roster.live[i].handle for i in self.pending.values() if i in parts.roster}
        for learner_id, why in parts.watchdog.stuck(running):
            self._forget(learner_id)
            parts.elastic.drop(learner_id, why)


def roll_back(parts: LoopParts, results: list) -> bool:
    """Carry out the rollbacks' decision (`rollback.py`) after a diverged round, its learners
    between chunks: every learner's state loaded, the learning rate scaled, the counters read
    afresh. Returns whether the group must be re-formed."""
    rollbacks, roster, elastic = parts.rollbacks, parts.roster, parts.elastic
    lr_scales = [s.stats.get("lr_scale", 1.0) for s in roster.live.values()]
    decision = rollbacks.decide(results, lr_scales, parts.latest)
    elastic.on_every_learner(lambda s: load_entry(s.handle, rollbacks.store, *rollbacks.entry_for(s.id)))
    elastic.on_every_learner(lambda s: s.handle.set_lr_scale.remote(decision.scale))
    for learner_id, counters in elastic.on_every_learner(lambda s: s.handle.counters.remote()).items():
        roster.live[learner_id].stats = counters
    rollbacks.rolled_back(decision)
    return decision.broken


def take_counters(parts: LoopParts) -> None:
    """Every live learner's counters before the first chunk; one whose actor or node died
    meanwhile is dropped like any dead learner (a node lost as the loop starts must not end the job)."""
    roster = parts.roster
    answers, failed = parts.runtime.gather({slot.handle.counters.remote(): slot.id for slot in roster.live.values()})
    for learner_id, stats in answers:
        roster.live[learner_id].stats = stats
    for learner_id, error in failed:
        parts.elastic.drop(learner_id, error)


def chunk_steps(lockstep: bool, learners: int, arriving: bool) -> int:
    """Steps in a learner's next chunk: CHUNK_STEPS, times one per ROUND_LEARNERS learners in a
    lockstep round; 2 while a learner starts, so it joins a lockstep group soon after it is ready."""
    if not lockstep:
        return CHUNK_STEPS
    return 2 if arriving else CHUNK_STEPS * -(-learners // ROUND_LEARNERS)


def epochs_spent(budget, epoch_now: float) -> bool:
    """The epoch budget is reached: its evaluation is the end-of-run one (`job._run`), taken once
    what the group's kind settles before it has settled (e.g. gossip's exchanges in flight). One
    taken at once caught a free-running group mid-exchange: a learner's weights changed between its
    state file and the average (a CI failure: the saved average off the learners' mean;
    hierarchical leaders 0.17 apart, not < 0.15)."""
    return budget.epochs is not None and epoch_now >= budget.epochs


def clock_due(budget, last_eval: float) -> bool:
    """An evaluation is due by the clock (`budget.eval_every_seconds` since the last)."""
    return budget.eval_every_seconds is not None and time.time() - last_eval >= budget.eval_every_seconds


def mean_loss(losses: list[tuple[float, int]]) -> float:
    """The mean step loss of chunks of different lengths (an epoch's 1-step tail weighs 1 step)."""
    steps = sum(n for _, n in losses)
    return sum(loss * n for loss, n in losses) / steps if steps else sum(loss for loss, _ in losses) / len(losses)
