"""Group: the learner group over the roster's live learners — forming and re-forming it, the
shard plan that goes with its members, rebalancing by measured speed, and what the training loop
asks of its kind. What differs between kinds is the kind's plug-in (`orchestrator/groups/kind.py`,
`registry.py`): its `GroupStrategy` and the calls it makes on learners; nothing here names a kind.

Members of a kind that `swaps_running` are swapped in while learners run (the change holds from
their next step); the others re-form their process groups from the learners' in-memory state (no
restart), once every learner is between chunks. A learner that dies or hangs while its group
forms is dropped, and the group is formed again without it.
"""

from __future__ import annotations

import re
import secrets
import time

from orchestrator.driver.roster import reason
from orchestrator.groups.errors import GroupCannotForm
from orchestrator.groups.registry import call, kind_of
from orchestrator.groups.rendezvous import Meeting
from orchestrator.groups.strategies import strategy_for

JOIN_TIMEOUT_S = 60.0  # a member that has not joined its group by then (rendezvous takes <= 15 s) is stuck
MAX_FAILED_FORMS = 5  # failed re-forms in a row in which nobody died: something else is wrong
SAME_FAILURE_FORMS = 2  # forms in a row in which every member's join failed the same way: it will repeat


class Group:
    """The learner group over the roster's live learners: formed, re-formed and rebalanced.

    Args:
    job_id, spec: the job; runtime: where learners run; roster: the job's learners.
    elastic: drops learners that die while the group forms; events: the job's EventLog.
    clock: what a formation's bound is timed by (time.time; a test's own).
    """

    def __init__(self, job_id: str, spec, runtime, roster, elastic, events, clock=time.time):
        self.job_id, self.spec, self.runtime, self.roster, self.clock = job_id, spec, runtime, roster, clock
        self.elastic, self.events = elastic, events
        self.strategy = strategy_for(spec, runtime.distributed)
        self.kind = kind_of(spec.group.kind) if runtime.distributed else None  # its plug-in (none: a group of one)
        self._failed_forms = 0
        self._same_failure: tuple[str, int] = ("", 0)  # (every member's join error, forms in a row)
        self.meetings = Meetings(runtime, elastic, spec.group.interface)
        self.meeting = self.meetings.new  # what strategies ask (`strategies.Rendezvous`), with `backend`

    @property
    def name(self) -> str:
        return self.strategy.name

    @property
    def lockstep(self) -> bool:
        return self.strategy.lockstep

    @property
    def swaps_running(self) -> bool:
        """A change is swapped in while learners run, not re-formed between chunks."""
        return self.strategy.swaps_running

    def before_last_evaluation(self) -> list[str]:
        """The calls its kind makes on every learner, in order, before the last evaluation."""
        return list(self.kind.before_last_evaluation) if self.kind else []

    def call(self, handle, name: str, *args):
        """Its kind's call `name` on a learner (`registry.call`): the object ref."""
        return call(handle, self.kind.name, name, *args)

    @property
    def node_groups(self) -> list[list[int]]:
        return self.strategy.node_groups

    def dispatch_units(self) -> list[list[int]]:
        return self.strategy.dispatch_units(self.roster)

    def handover(self, slot) -> int | None:
        """Before `slot` leaves cleanly, the learner its strategy names takes its weights by one
        last pairwise average; that learner's id, or None (nobody needs to, or one of them died
        meanwhile: only the average is lost)."""
        keeper = self.strategy.handover(self.roster, slot)
        if keeper is None:
            return None
        try:
            self.runtime.get(self.roster.live[keeper].handle.average.remote(slot.handle.weights.remote()))
            return keeper
        except Exception:  # noqa: BLE001 - the keeper or the leaver died meanwhile
            return None

    # -- what strategies ask of learners (`strategies.Rendezvous`) --------------------------------
    def backend(self, handles) -> str:
        devices = set(self.runtime.get([h.device.remote() for h in handles]))
        return "nccl" if devices == {"cuda"} else "gloo"

    def form(self) -> bool:
        """Build the group over the live learners and hand every learner its member. Returns
        whether it must be formed again: a learner died or hung meanwhile (it is dropped; only
        it), or a join failed because of another member (the others stay)."""
        roster = self.roster
        roster.order = self.strategy.order(roster)
        self.meetings.forget()
        try:
            members = self.strategy.members(roster, self)
        except Exception as exc:  # noqa: BLE001 - a member died while being asked its device or address
            if not self._drop_silent(exc):
                raise
            return True
        self.plan_shards(wait=not self.strategy.swaps_running)
        refs = {}
        for learner_id, member in zip(list(roster.order), members, strict=True):
            slot = roster.live[learner_id]
            swap = self.strategy.swaps_running and slot.in_group  # no setup: swapped in while running
            refs[slot.handle.regroup.remote(member) if swap else slot.handle.join.remote(member)] = learner_id
            slot.in_group = True
        if self.strategy.swaps_running or not self.runtime.distributed:
            return False  # swaps are immediate; a learner that died shows up through its run
        return self._joined(refs)

    def _joined(self, joins: dict) -> bool:
        """Wait (bounded) for every member's join; drop those that died or never answered (a death
        calls the formation's rendezvous off, so the others fail at once instead of waiting for
        it). When every member's join failed the same way and nobody died, SAME_FAILURE_FORMS
        times in a row, the cause is not a member: `GroupCannotForm` stops the job, naming it."""
        pending, deadline, failures = dict(joins), self.clock() + JOIN_TIMEOUT_S, []
        again = dropped = False
        while pending:
            ready = self.runtime.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - self.clock()))
            if not ready:
                break
            for ref in ready:
                learner_id = pending.pop(ref)
                try:
                    self.runtime.get(ref)
                except Exception as exc:  # noqa: BLE001 - it died, or a peer did and the join failed
                    again = True
                    if self.runtime.is_gone(exc):
                        self.elastic.drop(learner_id, exc)
                        dropped = True
                        self.meetings.call_off(f"learner {learner_id} is gone")
                    else:
                        failures.append(reason(exc))
                        self.events.emit("regroup", f"learner {learner_id} could not join its group "
                                         f"({reason(exc)}); forming it again", learner=learner_id)
        for learner_id in pending.values():
            self.elastic.drop(learner_id, f"stuck: no answer {JOIN_TIMEOUT_S:g} s into joining its group")
            again = dropped = True
        self._check_repeating(failures if not dropped and len(failures) == len(joins) > 1 else [])
        self._failed_forms = self._failed_forms + 1 if again else 0
        if self._failed_forms > MAX_FAILED_FORMS:
            raise RuntimeError(f"{self.job_id}: the group failed to form {self._failed_forms} times in a row")
        return again

    def _check_repeating(self, failures: list[str]) -> None:
        """Count forms in a row whose every join failed with one error (numbers aside: ports and
        addresses differ per member); raise GroupCannotForm at SAME_FAILURE_FORMS."""
        shapes = {re.sub(r"\d+", "#", f) for f in failures}
        if len(shapes) != 1:
            self._same_failure = ("", 0)
            return
        shape = shapes.pop()
        count = self._same_failure[1] + 1 if self._same_failure[0] == shape else 1
        self._same_failure = (shape, count)
        if count >= SAME_FAILURE_FORMS:
            raise GroupCannotForm(
                f"{self.job_id}: the {self.strategy.name} group cannot form: all {len(failures)} learners failed "
                f"to join it the same way {count} times in a row, so replacing them would not help: {failures[0]}")

    def _drop_silent(self, exc: Exception) -> bool:
        """After `exc` from a call to every member: drop the members that no longer answer a
        ping; returns whether there were any (else `exc` was something else)."""
        if not self.runtime.is_gone(exc):
            return False
        pings = {self.roster.live[i].handle.ping.remote(): i for i in self.roster.order if i in self.roster}
        ready = self.runtime.wait(list(pings), num_returns=len(pings), timeout=5.0)
        answered, _ = self.runtime.gather({ref: pings[ref] for ref in ready})
        silent = [i for i in pings.values() if i not in {i for i, _ in answered}]
        for i in silent:
            self.elastic.drop(i, exc)
        return bool(silent)

    def plan_shards(self, wait: bool = True) -> None:
        """Tell the planner the members (and their weights) for the next unstarted epoch. With
        `wait`, until it has them: a re-formed collective's first round must split its next epoch
        among exactly its members. Without (members swapped in running, new weights for the same
        members) the driver goes on at once: the planner's one thread also answers every
        learner's shard request, and with 32 learners its answer took up to 1.2 s, all of it
        between the driver's chunks. A learner that asks first gets the split as it was for that
        epoch (old weights; a newcomer moves on to the next epoch), as if it had asked earlier."""
        if not self.runtime.distributed:
            return
        weights, ids = self.strategy.shard_weights(self.roster), list(self.roster.order)
        told = self.elastic.service.set_members.remote(ids, weights)
        if wait:
            self.runtime.get(told)
        self.strategy.planned = (ids, weights)

    def rebalance(self) -> bool:
        """Adapt to measured speeds (at epoch boundaries), as the strategy says (new shard weights
        from the next unstarted epoch, a new order swapped in or formed at once); returns whether
        the group changed."""
        if not self.runtime.distributed or len(self.roster) < 2:
            return False
        change = self.strategy.rebalance(self.roster)
        if change is None:
            return False
        if change.replan:
            self.plan_shards(wait=False)
        if change.regroup:
            self.form()
        message, fields = self.strategy.rebalanced(self.roster)
        self.events.emit("rebalance", message, **fields)
        return True

    def by_accelerator(self) -> dict[str, dict]:
        """With `accelerator_types`: each kind's live learners, their measured samples/s in all
        and their share of each step's batch (where the group has shares)."""
        kinds = self.spec.accelerator_types
        if not kinds or not self.runtime.distributed:
            return {}
        shares = self.strategy.shares(self.roster)
        out = {}
        for kind in kinds:
            mine = [s for s in self.roster.live.values() if s.slot is not None and kind in s.slot.bundle]
            out[kind] = {"learners": sorted(s.id for s in mine),
                         "samples_per_s": round(sum(s.speed or 0.0 for s in mine), 2),
                         "share": round(sum(shares.get(s.id, 0.0) for s in mine), 4) if shares else None}
        return out


class Meetings:
    """Where a formation's process groups meet: a fresh board of the job's service per group
    (`groups/rendezvous.py`), called off when a member dies while the others wait on it, and
    forgotten when the next formation begins.

    Args: runtime; elastic (its `service` hosts the boards); interface (`group.interface`)."""

    def __init__(self, runtime, elastic, interface: str | None = None):
        self.runtime, self.elastic, self.interface = runtime, elastic, interface
        self.boards: list[str] = []  # the boards of the last formation

    def new(self, handles) -> Meeting:
        """A meeting for a process group of `handles`: a fresh board, the addresses their groups
        bind to (the only ones its listeners admit)."""
        peers = self.runtime.get([h.group_address.remote(self.interface) for h in handles])
        nodes = self.runtime.get([h.ip.remote() for h in handles])
        meeting = Meeting(self.elastic.service, secrets.token_hex(12), peers, nodes)
        self.boards.append(meeting.name)
        return meeting

    def call_off(self, why: str) -> None:
        """The formation's members still waiting at its rendezvous fail now (`why`)."""
        for name in self.boards:
            self.runtime.submit(self.elastic.service, "abort_board", name, why)

    def forget(self) -> None:
        """The last formation's boards are done with: a new one begins."""
        if self.boards and self.elastic.service is not None:
            self.runtime.submit(self.elastic.service, "forget_boards", self.boards)
        self.boards = []
