"""Shared fixtures: one small synthetic corpus per session (real espeak-ng speech in a temp dir)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # explicit, as DESIGN.md asks


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A 160-utterance corpus (train) with 20 each in dev, test and test-unseen."""
    from jobs.synth import synthesize

    out = tmp_path_factory.mktemp("corpus")
    synthesize(out, utterances=160, eval_utterances=20, seed=7, workers=2, progress=False)
    return out


@pytest.fixture(scope="session")
def ray_cluster():
    """A two-node Ray cluster on this machine (ray.cluster_utils.Cluster), 2 CPUs per node, for
    the whole session; the driver is connected to it. The worker node (`cluster.session_worker`)
    also offers 2 `learner_slot`s, a custom resource that elastic tests ask learners to hold."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "_system_config": {
            "metrics_report_interval_ms": 1000,  # metrics reach each node's exporter every second (default 10 s)
            # a lost node is declared dead within ~3 s (Ray's defaults take ~30 s)
            "health_check_period_ms": 1000, "health_check_failure_threshold": 3}})
    cluster.session_worker = cluster.add_node(num_cpus=2, resources={"learner_slot": 2})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="session")
def ray_session(ray_cluster):
    import ray

    return ray
