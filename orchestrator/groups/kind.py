"""What a kind of group is, as a plug-in (`GroupKind`): everything of one kind lives in its own
module under `orchestrator/groups/` and is named to the rest of Chorus by one line of
`registry.py`. The driver, the learner service and the checkpoint ask a kind only what this
class answers, never its name:

- `options`: its own section of the job spec (`group.<name>:`, a pydantic model), validated with
  the rest of the spec;
- `strategy`: what the driver does with a group of this kind (`strategies.GroupStrategy`: the
  order, the members, lockstep or free-running, swapped in running or re-formed, dispatch units,
  shard weights, rebalancing, handover, who writes a checkpoint's state);
- `process_state`: what the kind keeps in a learner's process across re-formed groups (made on
  first use; closed with the learner), e.g. the links a learner serves; one with `state_dict` /
  `load_state_dict` is saved with the learner's state (`kind_states.py`: checkpoints, resumes,
  a newcomer's adoption);
- `calls`: what learners and the driver ask of a learner of this kind, through the learner's one
  generic `member_call` (never a kind's own actor method): `call(learner, member, state, *args)`;
- `before_last_evaluation`: calls made on every learner, in order, after training and before the
  last evaluation (what must settle so that it evaluates what the group agreed on);
  `settles_equal`: when every learner's last such call answers True, every replica holds the same
  weights then, so the last evaluation takes one learner's model and the checkpoint one state
  (summing models and writing every state crosses slow links: minutes at 5 Mbit/s).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GroupKind:
    """One kind of group (see the module's docstring)."""

    name: str
    strategy: type
    options: type | None = None
    process_state: Callable | None = None
    calls: dict[str, Callable] = field(default_factory=dict)
    before_last_evaluation: tuple[str, ...] = ()
    settles_equal: bool = False
    call_groups: dict[str, str] = field(default_factory=dict)  # call -> the learner's concurrency group it runs on
