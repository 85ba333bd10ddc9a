"""cluster.yaml, the Ray cluster-launcher config, against Ray's own schema and what Chorus needs
of it: a head and two GPU worker types of different generations, each with its own custom
resource and accelerator label; setup that installs Chorus; a dashboard reachable only by SSH."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


def _config() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def _schema() -> dict:
    return json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())


def test_cluster_yaml_is_valid_against_rays_schema():
    jsonschema.validate(_config(), _schema())  # raises, naming the key, when it is not


def test_rays_schema_catches_a_broken_cluster_yaml():  # the check above can fail
    broken = _config()
    broken["available_node_types"]["gpu_v100"]["resources"] = {"V100": "eight"}
    try:
        jsonschema.validate(broken, _schema())
    except jsonschema.ValidationError as exc:
        assert "eight" in str(exc)
    else:
        raise AssertionError("a non-integer resource passed Ray's schema")


def test_two_gpu_generations_a_head_and_the_setup_chorus_needs():
    config = _config()
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"] == {}  # no learners on the head
    workers = {name: t for name, t in types.items() if name != config["head_node_type"]}
    assert len(workers) == 2
    generations = {t["labels"]["chorus-accelerator"] for t in workers.values()}
    assert len(generations) == 2
    for t in workers.values():
        # its GPUs declared (a job's `accelerator: auto` reads them before any node exists) and
        # its own custom resource, one per GPU
        assert set(t["resources"]) == {"CPU", "GPU", t["labels"]["chorus-accelerator"]}
        assert t["resources"]["GPU"] >= 1 and t["resources"][t["labels"]["chorus-accelerator"]] == t["resources"]["GPU"]
        assert 0 <= t["min_workers"] <= t["max_workers"] <= config["max_workers"]
    setup = " ".join(config["setup_commands"])
    assert "pip install" in setup and "~/chorus" in setup and config["file_mounts"]["~/chorus"] == "."
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start and "RAY_AUTH_MODE=token" in head_start


def test_what_a_job_reads_of_the_node_types_its_autoscaler_may_launch():
    from orchestrator.cluster.resources import node_types_of

    types = {t.name: t for t in node_types_of(_config())}
    assert set(types) == {"gpu_v100", "gpu_a10g"}  # not the head
    assert types["gpu_v100"].resources["GPU"] == 8 and types["gpu_v100"].max_count == 2
    assert types["gpu_a10g"].resources["A10G"] == 4 and types["gpu_a10g"].max_count == 4
