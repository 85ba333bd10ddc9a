"""deploy/kuberay/rayjob.yaml against KubeRay's published RayJob CRD (deploy/kuberay/crd/, v1.7.0),
validated as `kubectl apply --validate=strict` would (types, enums, required fields, and no
unknown field), and against what Chorus needs of it: worker groups that mirror cluster.yaml's GPU
node types, token authentication, and an entrypoint that is a valid `chorus train` command."""

from __future__ import annotations

import copy
import functools
import gzip
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "deploy" / "kuberay" / "crd" / "ray.io_rayjobs-v1.7.0.yaml.gz"
MANIFEST = ROOT / "deploy" / "kuberay" / "rayjob.yaml"


@functools.cache
def schema() -> dict:
    """The CRD's `v1` OpenAPI schema, strict: every object that lists its properties takes no other
    (Kubernetes prunes unknown fields silently; `--validate=strict` rejects them)."""
    crd = yaml.load(gzip.decompress(CRD.read_bytes()), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))


def _strict(node):
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)
    return node


def documents() -> list[dict]:
    return list(yaml.safe_load_all(MANIFEST.read_text()))


def manifest() -> dict:
    """The RayJob (the file's first document)."""
    return documents()[0]


def errors(document: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(schema())
    return [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]


def test_the_rayjob_manifest_is_valid_against_kuberays_crd():
    document = manifest()
    assert document["apiVersion"] == "ray.io/v1" and document["kind"] == "RayJob"
    assert errors(document) == []


@pytest.mark.parametrize("break_it, expected", [
    (lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(maxReplicas="two"),
     "spec.rayClusterSpec.workerGroupSpecs.0.maxReplicas: 'two' is not of type 'integer'"),
    (lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][1].pop("groupName"),
     "spec.rayClusterSpec.workerGroupSpecs.1: 'groupName' is a required property"),
    (lambda d: d["spec"]["rayClusterSpec"]["authOptions"].update(mode="password"),
     "spec.rayClusterSpec.authOptions.mode: 'password' is not one of ['disabled', 'token']"),
    (lambda d: d["spec"]["rayClusterSpec"].update(workerGroupSpec=[]),  # a typo Kubernetes would drop silently
     "spec.rayClusterSpec: Additional properties are not allowed ('workerGroupSpec' was unexpected)"),
])
def test_a_broken_copy_fails_validation_naming_the_field(break_it, expected):
    document = manifest()
    break_it(document)
    assert expected in errors(document)


def test_the_worker_groups_mirror_cluster_yaml_and_authentication_is_on():
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    spec = manifest()["spec"]["rayClusterSpec"]
    assert spec["authOptions"]["mode"] == "token" and spec["enableInTreeAutoscaling"] is True
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert head["labels"] == cluster["available_node_types"][cluster["head_node_type"]]["labels"]
    groups = {g["groupName"].replace("-", "_"): g for g in spec["workerGroupSpecs"]}
    types = {k: v for k, v in cluster["available_node_types"].items() if k != cluster["head_node_type"]}
    assert set(groups) == set(types)
    for name, node in types.items():
        group = groups[name]
        custom = {k: v for k, v in node["resources"].items() if k not in ("CPU", "GPU")}
        assert group["resources"] == {k: str(v) for k, v in custom.items()}, name
        assert group["labels"] == node["labels"], name
        assert (group["minReplicas"], group["maxReplicas"]) == (node["min_workers"], node["max_workers"]), name
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == str(node["resources"]["GPU"]), name


def test_the_entrypoint_is_a_valid_chorus_train_command():
    from orchestrator.cli.submit import validate

    words = shlex.split(manifest()["spec"]["entrypoint"])
    assert words[:2] == ["chorus", "train"]
    overrides = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    assert validate(ROOT / words[2], overrides) == ("job", "tiny")  # raises SpecError, naming the key
    assert words[words.index("--out") + 1].startswith("s3://")


def test_the_network_policies_admit_the_jobs_ports_from_its_own_pods_only():
    """Every pod template carries the job's label; one policy selects them all and admits only
    pods with that label (every port: learners pick theirs per run); the other opens only the
    head's dashboard port. NetworkPolicies add up: nothing else reaches the job's pods."""
    rayjob, *policies = documents()
    assert [p["kind"] for p in policies] == ["NetworkPolicy", "NetworkPolicy"]
    assert all(p["apiVersion"] == "networking.k8s.io/v1" and p["spec"]["policyTypes"] == ["Ingress"] for p in policies)
    spec = rayjob["spec"]["rayClusterSpec"]
    templates = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    label = {"chorus-job": rayjob["metadata"]["name"]}
    assert all(t["metadata"]["labels"].items() >= label.items() for t in templates)
    job_only, dashboard = policies
    assert job_only["spec"]["podSelector"]["matchLabels"] == label
    assert job_only["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": label}}]}]  # no port opened
    assert dashboard["spec"]["podSelector"]["matchLabels"] == {**label, "ray.io/node-type": "head"}
    assert dashboard["spec"]["ingress"] == [{"ports": [{"port": 8265, "protocol": "TCP"}]}]
    ports = {p["containerPort"] for p in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
    assert 8265 in ports
