"""The `diloco` kind: DiLoCo (Douillard et al. 2023, arXiv 2311.08105) on an elastic group, with
Streaming DiLoCo's fragments (arXiv 2501.18512) and compressed outer gradients.

Each learner takes inner steps with its own optimizer (the spec's) on its own shard; the group
agrees only every round. At a round's end every member sends its *pseudo-gradient* — the global
weights (the last outer step's) minus its own weights — weighted by the samples it trained since,
the weighted mean is taken by an all-reduce over the round's members (summed host by host, and
between hosts compressed with error feedback under `group.compression`: `host_reduce.py`), and
every member applies the same outer step to the global weights: SGD with Nesterov momentum,
`outer_lr` 0.7 and momentum 0.9 by default, as in the paper. A round is `inner_steps` steps, or
`round_seconds` of wall time, in which learners of different speeds each do what they can (a
slow learner trains fewer samples and weighs less; it never holds a fast one back by more than
its last step: it starts no step it cannot finish inside the round).
With `warmup_steps: W` the run's first W inner steps each end a one-step round (post-local SGD,
Lin et al. 2020): a round's drift costs most while the rate is high and the model leaves its first
plateau; on tiny.yaml's 20-epoch run, 10-step rounds from the start lost 19% relative test WER
against allreduce per sample (bench/README, "Per sample").

With `streaming.fragments: F` the weights are cut into F fragments and a sync carries one of them,
every round / F, in turn (Streaming DiLoCo): each fragment still syncs once a round, but the bytes
are spread over the round. A sync runs in a thread of its own while the next inner steps go on;
when it lands, the fragment's global weights take the outer step and the learner's fragment
becomes the new global plus what it trained since the sync was sent (the eager/delayed merge), so
a slow link costs no waiting while a sync's bytes take less than a round / F to cross.

The driver runs the group in lockstep: one learner's chunk is one round / F. At its end the
members take one small exact all-reduce (a barrier), then the sync starts; evaluations, joins and
leaves happen between rounds. Epochs are each learner's own, as in gossip: a learner whose part of
an epoch is used up moves on to its next epoch inside the round (parts are cut by measured speed,
so they end at about the same time; an error in them costs no waiting). Only the last epoch of
`budget.epochs` is ended together: a learner that has used its part up takes no more steps, and
when the barrier finds every member in that epoch with nothing left, all end it (a chunk that all
ended so sends no sync: it would first wait for the sync in flight, a slow link's transfer time).
Before 2026-11-29 every epoch was ended so, together: in `bench/heterogeneous.py` (one learner 3x
slow, rounds of 5 s, an epoch ~10 s) fast learners idled at each epoch's end. The group is
elastic:
- a re-formed group (a member died, left, was found stuck and dropped, or one joined) takes rank
  0's global weights and outer state (a newcomer also adopted a live peer's state: `kind_states.py`),
  then sums what each member trained since its last sync that landed (a sync a dead member broke
  included), so a member that is gone is dropped from that round's average and nothing the others
  trained is lost; every member then starts from the global weights;
- the global weights, the outer momentum and the syncs count are the learner's `OuterState`, saved
  in its state: checkpoints hold them, a resume continues from them (the progress since the last
  sync that landed is not saved: a resumed run starts from the global weights);
- before the last evaluation every member waits for its sync in flight and syncs what is left, so
  the model evaluated last is the global one (evaluations between rounds average the replicas).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.groups.diloco.member import DilocoMember
from orchestrator.groups.diloco.outer import NAME, OuterState
from orchestrator.groups.host_reduce import hosts_of
from orchestrator.groups.kind import GroupKind
from orchestrator.groups.strategies import GroupStrategy, Rebalance, Rendezvous


class Streaming(BaseModel):
    """`group.diloco.streaming`: Streaming DiLoCo's fragments.

    Args:
    fragments: how many parts of the weights sync in turn, one every round / F (1: all at once,
        at each round's end); each still syncs once a round, but a sync carries 1/F of the bytes.
    """

    model_config = ConfigDict(extra="forbid")
    fragments: int = Field(1, ge=1, le=64)


class DilocoOptions(BaseModel):
    """`group.diloco`: DiLoCo's rounds and outer optimizer.

    Args:
    inner_steps: a round's inner steps on each learner (50 when `round_seconds` is not given).
    round_seconds: a round's wall seconds instead of its steps: each learner does what it can in
        it (weighted by its samples in the mean), so a slow learner holds no fast one back.
    outer_lr: the outer optimizer's learning rate (SGD on the members' mean pseudo-gradient).
    momentum: the outer optimizer's momentum.
    nesterov: Nesterov momentum (as the paper), else plain momentum.
    streaming: Streaming DiLoCo's fragments (`{fragments: F}`).
    warmup_steps: the run's first inner steps (by the learners' step count) sync after every step, a
        fragment at a time, before rounds begin (post-local SGD, Lin et al. 2020: frequent syncs
        while the rate is high and the model leaves its first plateau); 0: rounds from the start.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    inner_steps: int | None = Field(None, ge=1, le=1_000_000)
    round_seconds: float | None = Field(None, gt=0, le=86_400)
    outer_lr: float = Field(0.7, gt=0, le=10)
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = True
    streaming: Streaming = Streaming()
    warmup_steps: int = Field(0, ge=0, le=100_000_000)

    @model_validator(mode="after")
    def _one_round_length(self):
        if self.inner_steps is not None and self.round_seconds is not None:
            raise ValueError("give a round as inner_steps or as round_seconds, not both")
        if self.inner_steps is None and self.round_seconds is None:
            self.inner_steps = 50
        return self


class DilocoStrategy(GroupStrategy):
    """DiLoCo: inner steps on every learner, an outer Nesterov step on the members' mean
    pseudo-gradient every round (`group.diloco`), fragments in turn; shards by measured speed."""

    name = NAME
    replicas_equal = False  # between syncs every learner has its own weights

    def members(self, roster, rendezvous: Rendezvous) -> list:
        handles = [roster.live[i].handle for i in roster.order]
        backend, meeting = rendezvous.backend(handles), rendezvous.meeting(handles)
        hosts = hosts_of([roster.live[i].node or "" for i in roster.order]) if self.spec.group.topology_aware \
            else None
        options = self.spec.group.options or DilocoOptions()
        return [DilocoMember(i, len(handles), meeting, options, backend, hosts, self.compression, self.interface,
                             max_epochs=self.spec.budget.epochs) for i in range(len(handles))]

    def shard_weights(self, roster) -> list[float] | None:
        """By measured speed (`group.balance`): every learner's part of an epoch, and its batches,
        in proportion, so all use their parts up together and each round's steps cost alike."""
        speeds = [roster.live[i].speed for i in roster.order]
        if not (self.balance and len(speeds) > 1) or any(s is None or s <= 0 for s in speeds):
            return None
        return [round(s / sum(speeds), 4) for s in speeds]

    def rebalance(self, roster) -> Rebalance | None:
        return self.replan_if_moved(self.shard_weights(roster))

    def rebalanced(self, roster) -> tuple[str, dict]:
        weights = dict(zip(roster.order, self.planned[1], strict=True))
        return ("DiLoCo shards by measured speed: " + ", ".join(f"learner {i} {w:.2f}" for i, w in weights.items()),
                {"weights": {str(i): w for i, w in weights.items()},
                 "speeds": {str(i): round(roster.live[i].speed, 2) for i in roster.order}})


def finish(learner, member, state) -> bool:
    """The job's end, before the last evaluation: `DilocoMember.finish` (True: on the global weights)."""
    return isinstance(member, DilocoMember) and member.finish(learner)


KIND = GroupKind(NAME, DilocoStrategy, options=DilocoOptions, process_state=OuterState, calls={"finish": finish},
                 before_last_evaluation=("finish",), settles_equal=True)
