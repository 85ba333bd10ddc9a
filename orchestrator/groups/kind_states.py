"""What the group kinds keep in one learner's process (`KindStates`): each kind's
`GroupKind.process_state`, made on first use and kept across re-formed groups. A state that has
`state_dict()` / `load_state_dict(saved)` is part of the learner's state — so it is in every
checkpoint, comes back on a resume, and reaches a learner that joins a running job with the
state it adopts from a live peer — as torchft's `register_state_dict_fn`."""

from __future__ import annotations

import threading

from orchestrator.groups.kind import GroupKind
from orchestrator.groups.registry import kind_of, names


class KindStates:
    """The kinds' states in one learner's process, by kind name."""

    def __init__(self):
        self._states: dict[str, object] = {}
        self._lock = threading.Lock()

    def get(self, kind: GroupKind, learner):
        """`kind`'s state in this process (None: it keeps none), made on first use."""
        if kind.process_state is None:
            return None
        with self._lock:
            if kind.name not in self._states:
                self._states[kind.name] = kind.process_state(learner)
            return self._states[kind.name]

    def state_dict(self) -> dict:
        """Each kind's saved state, for those that save one."""
        with self._lock:
            states = list(self._states.items())
        return {name: state.state_dict() for name, state in states if hasattr(state, "state_dict")}

    def counters(self) -> dict:
        """What the kinds' states count (those with `counters()`), by kind: the learner reports it
        with its own counters, and the run's summary sums it (`group_counters`)."""
        with self._lock:
            states = list(self._states.items())
        return {name: state.counters() for name, state in states if hasattr(state, "counters")}

    def load_state_dict(self, saved: dict, learner) -> None:
        """Back to `saved` (`state_dict`'s): each kind's state made if need be, then loaded (a kind
        this process does not know, or that saves nothing, is passed over: its state is not this
        job's concern)."""
        for name, state in saved.items() if isinstance(saved, dict) else ():
            if name in names():
                kept = self.get(kind_of(name), learner)
                if hasattr(kept, "load_state_dict"):
                    kept.load_state_dict(state)

    def close(self) -> None:
        with self._lock:
            states, self._states = list(self._states.values()), {}
        for state in states:
            getattr(state, "close", lambda: None)()
