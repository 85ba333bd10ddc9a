"""A model's floating-point state (parameters and floating buffers, in `state_dict` order) as one
flat CPU tensor: what learners add up in a tree to average their models for evaluation, and what
the evaluator loads. Integer buffers (counters) are not part of it."""

from __future__ import annotations

import torch


def floating_keys(model: torch.nn.Module) -> list[str]:
    return [k for k, v in model.state_dict().items() if v.is_floating_point()]


def to_vector(model: torch.nn.Module) -> torch.Tensor:
    """The model's floating-point state as one flat float32 tensor on the CPU."""
    state = model.state_dict()
    return torch.cat([state[k].detach().reshape(-1).float().cpu() for k in floating_keys(model)])


def load_vector(model: torch.nn.Module, vector: torch.Tensor) -> None:
    """Write `vector` (as made by `to_vector` of a model of the same shape) into `model`."""
    state, offset = model.state_dict(), 0
    with torch.no_grad():
        for key in floating_keys(model):
            target = state[key]
            n = target.numel()
            target.copy_(vector[offset:offset + n].view_as(target))
            offset += n
    if offset != vector.numel():
        raise ValueError(f"a model state of {vector.numel()} values does not fit a model of {offset}")


def trainable_mask(model: torch.nn.Module) -> torch.Tensor:
    """Which entries of `to_vector(model)` are trainable weights (the consensus distance's)."""
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    state = model.state_dict()
    return torch.cat([torch.full((state[k].numel(),), k in trainable, dtype=torch.bool)
                      for k in floating_keys(model)])
