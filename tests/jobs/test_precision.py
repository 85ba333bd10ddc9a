"""Mixed precision (`model.precision: bf16`): the forward pass runs in bfloat16 while weights,
gradients and the loss stay float32, and the loss is the float32 one to bfloat16's precision."""

import pytest
import torch

from jobs.sections import WorkloadConfig
from jobs.workload import AsrWorkload

pytestmark = pytest.mark.unit


def _workload(corpus, precision: str) -> AsrWorkload:
    config = WorkloadConfig(data={"train": corpus / "train.jsonl", "dev": corpus / "dev.jsonl",
                                  "max_batch_seconds": 10}, model={"precision": precision})
    return AsrWorkload(config, seed=0)


def test_bf16_runs_the_model_in_bfloat16_and_keeps_weights_gradients_and_loss_in_float32(corpus):
    full, mixed = _workload(corpus, "fp32"), _workload(corpus, "bf16")
    model = full.build_model()
    batch = next(iter(full.batches(0, 1, 0)))
    model.eval()  # no SpecAugment, no dropout: the two passes see the same input
    seen = []
    hook = model.out.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))  # the output layer
    reference = full.loss(model, batch)
    loss = mixed.loss(model, batch)
    hook.remove()
    assert seen == [torch.float32, torch.bfloat16]  # the same model; only the autocast differs
    with mixed.autocast(model):  # the log-probabilities come out float32 either way (log_softmax in float32)
        assert model(batch.feats, batch.feat_lengths)[0].dtype == torch.float32
    assert loss.dtype == reference.dtype == torch.float32
    assert torch.isfinite(loss) and abs(loss.item() - reference.item()) <= 0.02 * reference.item()
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
               for p in model.parameters() if p.requires_grad)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    evaluated, evaluated_full = mixed.evaluate(model, "dev"), full.evaluate(model, "dev")
    assert evaluated["utterances"] == evaluated_full["utterances"] > 0
    assert evaluated["loss"] == pytest.approx(evaluated_full["loss"], rel=0.02)
