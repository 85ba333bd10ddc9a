"""Faults a learner can be told to simulate: tests and bench/faults.py only."""

from __future__ import annotations

import ray
import torch


class SimulatedFaults:
    """Tests and bench/faults.py only: faults a learner can be told to simulate (`LearnerService`
    holds the flags and its learner)."""

    @ray.method(concurrency_group="mix")
    def simulate_exit_in_join(self) -> None:
        """Tests and bench/faults.py only: the process exits as its next `join` begins (its peers
        are then waiting for it at the rendezvous)."""
        self._exit_in_join = True

    @ray.method(concurrency_group="mix")
    def simulate_stall(self, seconds: float) -> None:
        """Tests and bench/faults.py only: the next step hangs `seconds` (alive, answering pings)."""
        self.learner._stall_s = float(seconds)

    def perturb(self, scale: float, seed: int) -> None:
        """Tests only: add Gaussian noise to the weights (make replicas disagree)."""
        gen = torch.Generator().manual_seed(seed)
        flat = self.learner.flat_weights()
        self.learner.load_flat_weights(flat + scale * torch.randn(flat.shape, generator=gen))

    def simulate_nan_loss(self, step: int | None) -> None:
        """Tests only (spec: simulate.nan_loss_at_step): the loss of `step` is NaN, once."""
        self.learner._nan_at = step

    @ray.method(concurrency_group="mix")
    def simulate_exit_in_average(self) -> None:
        """Tests and bench/faults.py only: the process exits inside the next averaging request or
        link exchange it serves, after its partner sent its request and before it answers."""
        self._exit_in_average = self.learner._exit_in_exchange = True
