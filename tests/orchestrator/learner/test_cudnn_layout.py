"""The flat weight buffer lays a recurrent module's weights out as cuDNN runs them in place
(orchestrator/learner/ `cudnn_weights`): back to back, in the module's order, from the start of
the buffer's storage, the condition ATen's `try_get_weight_buf` checks before it would compact
them at every call. On the CPU here, so the layout and the gradients are checked in CI; the
warning's absence on a GPU is `make gpu-check`'s."""

import pytest
import torch

from orchestrator.learner.replica import Learner
from orchestrator.service.shards import ShardPlanner
from tests.builders import make_spec

pytestmark = pytest.mark.unit


def _learner(corpus, **fields) -> Learner:
    spec = make_spec(corpus, features={"freq_mask": 0, "time_mask": 0}, model__dropout=0.0, **fields)
    return Learner("asr", spec.workload_config.model_dump(mode="json"), seed=0, learner_id=0,
                   planner=ShardPlanner([0]))


def test_the_lstm_weights_lie_back_to_back_from_the_start_of_the_flat_buffer(corpus):
    learner = _learner(corpus, model__layers=2)
    lstm = learner.model.lstm
    weights = [w for w in lstm._flat_weights if w is not None]
    assert len(weights) == 2 * 2 * 4  # 2 layers x 2 directions x (w_ih, w_hh, b_ih, b_hh)
    start, item = learner.flat.untyped_storage().data_ptr(), learner.flat.element_size()
    offset = 0
    for w in weights:
        assert w.untyped_storage().data_ptr() == start and w.is_contiguous()
        assert w.data_ptr() == start + offset * item
        offset += w.numel()
    assert learner.flat.numel() == sum(p.numel() for p in learner.params)  # and every other weight after them


def test_gradients_still_land_in_the_flat_buffer_and_match_plain_pytorch(corpus):
    learner = _learner(corpus)
    plain = learner.workload.build_model().train()  # the same seed: the same initial weights, no flat buffers
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), learner.model.state_dict().values(),
                                                  strict=True))
    batch = learner.next_batch()
    learner.forward_backward(batch)
    learner.workload.loss(plain, batch).backward()
    buffer = learner.grad_buffer.untyped_storage().data_ptr()
    for (name, p), q in zip(learner.model.named_parameters(), plain.parameters(), strict=True):
        assert p.grad.untyped_storage().data_ptr() == buffer, name
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name
    # a weight change through the flat buffer reaches the LSTM's own weights (they are views of it)
    learner.load_flat_weights(torch.zeros_like(learner.flat))
    assert float(learner.model.lstm.weight_ih_l0.detach().abs().sum()) == 0.0
