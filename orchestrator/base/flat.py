"""Flat tensors over a model: its floating-point state (parameters and floating buffers, in `state_dict` order) as one
flat CPU tensor: what learners add up in a tree to average their models for evaluation, and what
the evaluator loads. Integer buffers (counters) are not part of it.

It also owns the flat buffers a learner trains in, which its group reads and sums in place:
`flat_weight_buffer` (every parameter a view into one tensor), `flat_grad_buffer` (every gradient
one, with `GRAD_TAIL` slots after them) and `cudnn_weights` (which weights lead, for cuDNN)."""

from __future__ import annotations

import torch

GRAD_TAIL = 4  # slots after the gradients in the flat gradient buffer (`flat_grad_buffer`)


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


def cudnn_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The first recurrent module's trainable weights in its own order (w_ih, w_hh, b_ih, b_hh per
    layer and direction). cuDNN runs a recurrent module on its weights in place only when they lie
    back to back in that order from the start of their storage (ATen's `try_get_weight_buf`); else it
    compacts them into a new buffer at every call, with a warning. So the flat weight buffer starts
    with these. Only one module's can: in a model with several, the others are compacted."""
    rnn = next((m for m in model.modules() if isinstance(m, torch.nn.RNNBase)), None)
    return [w for w in rnn._flat_weights if w is not None and w.requires_grad] if rnn is not None else []


def flat_weight_buffer(params: list[torch.Tensor], device: torch.device,
                       first: list[torch.Tensor] = ()) -> torch.Tensor:
    """One flat tensor that every parameter's data becomes a view into (the parameters stay the
    same objects, so the optimizer is unaffected): weights are read, sent and averaged without
    gathering them first. The parameters of `first` (`cudnn_weights`) come first, in their order,
    then the others in theirs: the same layout on every learner, whatever its device."""
    buffer = torch.zeros(sum(p.numel() for p in params), device=device, dtype=params[0].dtype if params else None)
    leading = [p for p in first if any(p is q for q in params)]
    offset = 0
    for p in leading + [p for p in params if not any(p is q for q in leading)]:
        buffer[offset:offset + p.numel()].copy_(p.data.reshape(-1))
        p.data = buffer[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return buffer


def flat_grad_buffer(params: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One flat buffer that every gradient is a view into (as DDP's gradient_as_bucket_view), so
    groups all-reduce it in place without copies; GRAD_TAIL extra slots after the gradients carry
    what a collective step sums besides them (`groups/allreduce.py`: stop votes, batches left, batch
    size, loss)."""
    buffer = torch.zeros(sum(p.numel() for p in params) + GRAD_TAIL, device=device)
    offset = 0
    for p in params:
        p.grad = buffer[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return buffer
