"""Honest device placement (issue 40): a learner that reserved no GPU sees none, whatever its node
has; a learner may reserve a share of a GPU (`gpus_per_learner`), and the summary's nodes say so.

This machine has no GPU, so the GPU node is declared (`num_gpus=1`) and its processes are given
CUDA_VISIBLE_DEVICES=0 by hand, as a real GPU node's would see: what is checked is what each
learner's process is told, by Ray and by Chorus, and where the learners are placed."""

from __future__ import annotations

import pytest

from orchestrator.cluster.capacity import learner_bundle
from orchestrator.driver.config import parse_spec
from tests.builders import assert_nothing_left, linear_spec

LINEAR = {k: v for k, v in linear_spec(raw=True).items() if k in ("workload", "data", "optim")}


@pytest.mark.unit
def test_a_learner_reserves_its_share_of_a_gpu():
    assert learner_bundle(2.0, 0.5, {"V100": 1}) == {"CPU": 2.0, "V100": 1, "GPU": 0.5}
    assert learner_bundle(1.0, True) == {"CPU": 1.0, "GPU": 1.0}
    assert learner_bundle(1.0, 0.0) == {"CPU": 1.0}


@pytest.mark.unit
@pytest.mark.parametrize("extra, message", [
    ({"accelerator": "cpu", "gpus_per_learner": 0.5}, "gpus_per_learner is 0.5 but accelerator is cpu"),
    ({"accelerator": "gpu", "gpus_per_learner": 2}, "less than or equal to 1"),
    ({"accelerator": "gpu", "gpus_per_learner": 0}, "greater than 0"),
])
def test_a_gpu_share_that_cannot_be_is_refused_in_one_line(extra, message):
    with pytest.raises(ValueError, match=message):
        parse_spec({"name": "devices", **LINEAR, **extra})


@pytest.mark.unit
def test_the_evaluator_takes_a_gpu_only_when_the_spec_gives_the_service_one(monkeypatch):
    import torch

    from orchestrator.service.job_service import JobService

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a process that sees a GPU
    moved = []
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: moved.append(self) or self)
    workload = ("linear", parse_spec({"name": "devices", **LINEAR}).workload_config.model_dump(mode="json"), 0)
    JobService([0])._evaluator_for(workload)  # service_gpus: 0, the default
    assert moved == []
    JobService([0], use_gpu=True)._evaluator_for(workload)
    assert len(moved) == 1


@pytest.mark.slow
@pytest.mark.own_process
def test_cpu_learners_see_no_gpu_and_half_gpu_learners_share_one(private_cluster, tmp_path, monkeypatch):
    from orchestrator.driver.job import TrainingJob

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # what the GPU node's processes see (inherited)
    gpu_node = private_cluster.add_node(num_cpus=2, num_gpus=1, resources={"gpu_box": 2})
    private_cluster.wait_for_nodes()

    def run(name: str, **extra) -> tuple[dict, list[dict]]:
        spec = parse_spec({"name": name, "learners": 2, "group": {"kind": "allreduce"}, **LINEAR,
                           "learner_resources": {"gpu_box": 1}, "budget": {"epochs": 2, "wall_seconds": 120},
                           **extra})
        job = TrainingJob(spec, tmp_path / name)
        summary = job.run()
        return summary, [e for e in job.events.recorded if e["kind"] == "join"]

    summary, joins = run("cpu-learners", accelerator="cpu")
    assert summary["epochs"] >= 2
    assert [(e["device"], e["cuda_visible_devices"]) for e in joins] == [("cpu", "")] * 2, joins
    assert [(n["node_id"], n["gpus_per_learner"]) for n in summary["nodes"]] == [(gpu_node.node_id, 0.0)]

    summary, joins = run("half-gpu-learners", accelerator="gpu", gpus_per_learner=0.5)
    assert summary["epochs"] >= 2
    # both on the one GPU (Ray names it to each), which torch here cannot open: they train on the CPU
    assert [(e["device"], e["cuda_visible_devices"]) for e in joins] == [("cpu", "0")] * 2, joins
    [node] = summary["nodes"]
    assert (node["node_id"], sorted(node["learners"]), node["gpus_per_learner"]) == (gpu_node.node_id, [0, 1], 0.5)
    # a service asked to evaluate on a GPU, on a driver's node without one: refused at once
    from orchestrator.cluster.resources import CapacityError

    with pytest.raises(CapacityError, match="service_gpus is 0.5, but the driver's node has 0 GPUs"):
        run("gpu-service", accelerator="cpu", service_gpus=0.5)
    for name in ("cpu-learners", "half-gpu-learners", "gpu-service"):
        assert_nothing_left(name, within=30.0)
