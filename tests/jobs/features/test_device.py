"""Features computed on the learner's device (`features.compute_on: device`, jobs/features/device.py)
equal the CPU path's, utterance by utterance, with every augmentation on: the same draws, the same
speed, room, noise and warp, batched. Run here on the CPU, so CI covers the arithmetic the GPU runs."""

import pytest
import torch

from jobs.sections import WorkloadConfig
from jobs.workload import AsrWorkload

AUGMENT = {"speed_factors": [0.9, 1.0, 1.1], "noise_prob": 0.5, "reverb_prob": 0.5, "vtlp_warp": [0.9, 1.1]}
# normalized log-mel features (unit variance): float32 rounding of FFTs of other lengths (a batch's
# reverberation, a batched STFT) and sums in another order, nothing more: here at most 3.3e-4, mean 4e-7
# over 3 epochs of the 160 utterances
TOLERANCE = 2e-3


def _workload(train, compute_on: str, augment: dict) -> AsrWorkload:
    config = WorkloadConfig(data={"train": train, "max_batch_seconds": 20}, augment=augment,
                            features={"compute_on": compute_on})
    return AsrWorkload(config, seed=0)


@pytest.mark.unit
@pytest.mark.parametrize("augment", [AUGMENT, {}], ids=["augmented", "clean"])
def test_the_device_path_computes_the_cpu_paths_features(corpus, augment):
    cpu, device = (_workload(corpus / "train.jsonl", on, augment) for on in ("cpu", "device"))
    plan = [list(range(k, k + 16)) for k in range(0, 64, 16)]
    first = {}
    for epoch in (0, 1):
        for indices in plan:
            expected = cpu.train.collate(indices, epoch)
            raw = device.train.collate(indices, epoch)
            assert raw.feats is None and raw.audio is not None  # the input path left the features to the device
            got = raw.featurized(device.device_features)
            assert got.ids == expected.ids and got.feat_lengths.tolist() == expected.feat_lengths.tolist()
            assert got.feats.shape == expected.feats.shape
            assert (got.feats - expected.feats).abs().max() < TOLERANCE
            first.setdefault(epoch, got)
    if augment:  # the draws changed the audio: speed perturbation changed some utterances' lengths
        clean = _workload(corpus / "train.jsonl", "cpu", {}).train.collate(plan[0], 0)
        assert clean.feat_lengths.tolist() != first[0].feat_lengths.tolist()


@pytest.mark.unit
def test_a_device_batch_trains_and_evaluation_stays_on_the_cpu_path(corpus):
    w = _workload(corpus / "train.jsonl", "device", AUGMENT)
    model = w.build_model()
    batch = next(iter(w.batches(0, 1, 0)))
    assert batch.audio is not None
    loss = w.loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert w.train.collate([0, 1]).audio is None  # no epoch: evaluation reads clean cached features
    # halves (what a learner short of device memory trains) featurize to the whole batch's rows
    whole = batch.featurized(w.device_features)
    first, second = batch.halves()
    assert first.ids + second.ids == batch.ids
    for half, rows in ((first, slice(0, first.size)), (second, slice(first.size, None))):
        got = half.featurized(w.device_features)
        assert (got.feats - whole.feats[rows, : got.feats.shape[1]]).abs().max() < TOLERANCE
        assert torch.equal(got.feat_lengths, whole.feat_lengths[rows])
