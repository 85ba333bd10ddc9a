"""What the `diloco` kind keeps in a learner's process (`OuterState`: the global weights, the
outer momentum and its counts, saved with the learner's state) and how it cuts the weights into
fragments (`fragment_bounds`)."""

from __future__ import annotations

import threading

import torch

from orchestrator.groups.checks import finite

NAME = "diloco"


class OuterState:
    """What DiLoCo keeps in a learner's process across re-formed groups: the global weights, the
    outer momentum, the syncs that landed (saved with the learner's state), and what it trained
    since each fragment's last sync, the error feedback of its compressed sends and its counts
    (not saved)."""

    def __init__(self, learner):
        self.lock = threading.Lock()
        self.global_weights: torch.Tensor | None = None  # flat, on the CPU
        self.momentum: torch.Tensor | None = None
        self.syncs = 0  # fragment syncs that landed (the outer steps of one fragment each)
        self.pending: list[int] = []  # samples trained since each fragment's last sync was sent
        self.residuals: dict[int, object] = {}  # each fragment's error feedback (`compression.Residual`)
        self.fragments, self.catch_ups, self.lost_syncs, self.refused = 1, 0, 0, 0

    def begin(self, learner, fragments: int) -> None:
        """First use in this process, or a new fragment count: the global weights are its own."""
        with self.lock:
            if self.global_weights is None or self.global_weights.numel() != learner.numel:
                self.global_weights = learner.flat_weights().clone()
                self.momentum = torch.zeros_like(self.global_weights)
            if len(self.pending) != fragments:
                self.pending, self.residuals = [0] * fragments, {}
            self.fragments = fragments

    def outer_step(self, a: int, b: int, mean: torch.Tensor | None, options, advance: bool = True) -> bool:
        """Fragment [a, b)'s outer step on the members' mean pseudo-gradient `mean` (None: nobody
        trained): SGD with (Nesterov) momentum, as `options` say (`group.diloco`). A mean that is
        not finite (every member got the same bits) is refused alike by all: the global weights
        stay; returns False. `advance`: a sync of the rounds' turn (not a re-formed group's)."""
        refused = mean is not None and not finite(mean)
        with self.lock:
            if mean is not None and not refused:
                momentum = self.momentum[a:b].mul_(options.momentum).add_(mean)
                update = mean.add_(momentum, alpha=options.momentum) if options.nesterov else momentum
                self.global_weights[a:b].sub_(update, alpha=options.outer_lr)
            self.refused += refused
            self.syncs += advance
        return not refused

    def take(self, shared: torch.Tensor) -> bool:
        """Rank 0's state, sent as [global weights, momentum, syncs]; False (nothing taken) if not finite."""
        if not finite(shared):
            return False
        n = self.global_weights.numel()
        with self.lock:
            self.global_weights.copy_(shared[:n])
            self.momentum.copy_(shared[n:2 * n])
            self.syncs = int(shared[-1])
        return True

    def fingerprint(self) -> torch.Tensor:
        """Its syncs and float64 sums of the global weights and momentum: the same bits for the
        same state on every member (a group compares them before sending a state to all)."""
        with self.lock:
            g, m = self.global_weights.double(), self.momentum.double()
            return torch.stack([torch.tensor(float(self.syncs), dtype=torch.float64), g.sum(), g.abs().sum(),
                                (g * g).sum(), m.sum(), m.abs().sum()])

    def state_dict(self) -> dict:
        with self.lock:
            return {"global": self.global_weights, "momentum": self.momentum, "syncs": self.syncs}

    def load_state_dict(self, saved: dict) -> None:
        with self.lock:
            self.global_weights, self.momentum = saved.get("global"), saved.get("momentum")
            self.syncs = int(saved.get("syncs", 0))
            self.pending = [0] * len(self.pending)  # what this state's learner trained is not this one's

    def counters(self) -> dict:
        return {"syncs": self.syncs, "rounds": self.syncs // max(self.fragments, 1), "catch_ups": self.catch_ups,
                "lost_syncs": self.lost_syncs, "refused": self.refused}


def fragment_bounds(numel: int, fragments: int) -> list[tuple[int, int]]:
    """The flat weights cut into `fragments` contiguous parts of (nearly) equal size.

    Example:
        >>> fragment_bounds(10, 3)
        [(0, 3), (3, 7), (7, 10)]
    """
    cuts = [round(k * numel / fragments) for k in range(fragments + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))
