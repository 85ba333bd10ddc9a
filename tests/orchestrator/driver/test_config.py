import re
from pathlib import Path

import pytest
import yaml

from orchestrator.driver.config import JobSpec, SpecError, load_spec
from orchestrator.workload import workload_class

pytestmark = pytest.mark.unit

TINY = Path(__file__).parents[3] / "jobs" / "configs" / "tiny.yaml"


@pytest.fixture
def spec_file(stub_corpus, tmp_path):
    """tiny.yaml pointed at a corpus's manifests and folders (no audio: nothing is trained)."""
    raw = yaml.safe_load(TINY.read_text())
    raw["data"] = {"train": str(stub_corpus / "train.jsonl"), "dev": str(stub_corpus / "dev"),
                   "test": str(stub_corpus / "test.jsonl"), "test_unseen": str(stub_corpus / "test-unseen.jsonl")}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


CONFIGS = sorted(TINY.parent.glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
def test_shipped_job_specs_are_commented_on_every_line_and_valid(config, stub_corpus):
    for line in config.read_text().splitlines():
        if line.strip() and ":" in line and not line.strip().startswith("#"):
            assert "#" in line, f"uncommented line in {config.name}: {line!r}"
    data = [f"data.{s}={stub_corpus / 'train.jsonl'}" for s in ("train", "dev", "test", "test_unseen",
                                                                 "test_unseen_engine")]
    assert load_spec(config, data).name == config.stem


def test_the_gpu_recipe_sizes_its_model_for_a_gpu_and_computes_features_there(stub_corpus):
    spec = load_spec(TINY.parent / "conformer_gpu.yaml", [f"data.{s}={stub_corpus / 'train.jsonl'}"
                                                            for s in ("train", "dev", "test", "test_unseen")])
    config = spec.workload_config
    params = sum(p.numel() for p in workload_class("asr")(config, seed=0).build_model().parameters())
    assert params >= 30e6 and spec.accelerator == "gpu" and config.features.compute_on == "auto"
    assert config.data.max_batch_seconds >= 10 * yaml.safe_load(
        (TINY.parent / "conformer.yaml").read_text())["data"]["max_batch_seconds"]


def test_valid_spec_and_overrides(spec_file):
    spec = load_spec(spec_file, ["optim.lr=1e-3", "learners=3", "group.kind=gossip", "model.kind=conformer_ctc"])
    assert (spec.optim.lr, spec.learners.max, spec.group.kind, spec.model.kind) == (1e-3, 3, "gossip", "conformer_ctc")
    assert spec.data.dev.is_dir()


@pytest.mark.parametrize("overrides, expected", [
    (["optim.lrr=0.1"], "optim.lrr (from --set): unknown key"),
    (["model.hidden=wide"], "model.hidden (from --set): Input should be a valid integer"),
    (["model.kind=transformer"], "model.kind (from --set): Input should be 'bilstm_ctc' or 'conformer_ctc'"),
    (["model.tokenizer.kind=wordpiece"], "model.tokenizer.kind (from --set): Input should be 'char' or 'bpe'"),
    (["augment.speed_factors=[0.9, 3.0]"], "augment.speed_factors (from --set): speed factors must lie in [0.5, 2.0]"),
    (["augment.noise_snr_db=[30, 10]"], "augment.noise_snr_db (from --set): expected [low, high] with low <= high"),
    (["augment.reverb_prob=1.5"], "augment.reverb_prob (from --set): Input should be less than or equal to 1"),
    (["group.kind=ring"], "group.kind (from --set): Input should be one of the group kinds: allreduce, diloco, "
                          "gossip, hierarchical"),
    (["data.train=/no/such/train.jsonl"],
     "data.train (from --set): no such manifest or directory: '/no/such/train.jsonl'"),
    (["budget.epochs=null", "budget.wall_seconds=null"], "budget: set epochs or wall_seconds"),
    (["learners=0"], "learners.min: Input should be greater than or equal to 1"),
    (["learners={min: 3, max: 2}"], "learners (from --set): min (3) is above max (2)"),
    (["learners={min: 2, most: 4}"], "learners.most: unknown key"),
    (["optim.lr.x=1"], "'optim.lr' is a value, not a section"),
    (["optim.lr"], "expected key=value"),
    (["simulate.slowdown={1: 3.0}"], "simulate.slowdown names learner 1, but the job has at most 1 (indices 0..0)"),
    (["learners=2", "simulate.slowdown={0: 0.5}"],
     "simulate.slowdown (from --set): learner 0: factor 0.5 is below 1"),
    (["accelerator=tpu"], "accelerator (from --set): Input should be 'auto', 'gpu' or 'cpu'"),
    (["learner_resources={GPU: 1}"],
     "learner_resources (from --set): GPU is set by accelerator, not learner_resources"),
    (["learner_resources={V100: -1}"], "learner_resources (from --set): V100: -1.0 is negative"),
    (["accelerator_types=[V100, A10G]", "learner_resources={V100: 1}"],
     "V100 is in both accelerator_types and learner_resources"),
    (["accelerator_types=[V100, V100]"], "accelerator_types lists a kind twice"),
])
def test_bad_values_name_the_file_and_key(spec_file, overrides, expected):
    with pytest.raises(SpecError) as err:
        load_spec(spec_file, overrides)
    assert expected in str(err.value)
    assert str(err.value).startswith(f"{spec_file}: ")


def test_unknown_key_in_file_names_file_and_key(spec_file):
    raw = yaml.safe_load(spec_file.read_text())
    raw["features"]["num_mels"] = 40
    raw["extra_section"] = {}
    spec_file.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError) as err:
        load_spec(spec_file)
    assert f"{spec_file}: features.num_mels: unknown key" in str(err.value)
    assert f"{spec_file}: extra_section: unknown key" in str(err.value)


def test_unreadable_specs(tmp_path):
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(SpecError, match=rf"^{bad}: not valid YAML: expected ',' or '\]', but got '<stream end>' at "
                                        r"line 2, column 1$"):  # one line (PyYAML's message is five)
        load_spec(bad)
    bad.write_bytes(b"name: \xff\n")
    with pytest.raises(SpecError, match=rf"^{bad}: not valid YAML: not UTF-8 \(invalid start byte\)$"):
        load_spec(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec(bad)


def _float_keys(model, prefix: str = "") -> list[str]:
    """Every float field reachable from `model`, as a --set key (a dict of floats gets one entry)."""
    from pydantic import BaseModel

    keys = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = str(field.annotation)
        options = getattr(field.annotation, "__args__", (field.annotation,))  # X | None, dict[K, V] or X
        sub = next((a for a in options if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is not None:
            keys += _float_keys(sub, f"{key}.")
        elif "float" in annotation:
            entry = "0" if options[0] is int else "x"
            keys.append(f"{key}={{{entry}: VALUE}}" if annotation.startswith("dict") else f"{key}=VALUE")
    return keys


# the spec's own sections and, at the top level beside them, those of its (default) workload
FLOAT_KEYS = _float_keys(JobSpec) + _float_keys(workload_class("asr").Config)


def test_float_keys_found():
    assert "data.max_batch_seconds=VALUE" in FLOAT_KEYS and "simulate.slowdown={0: VALUE}" in FLOAT_KEYS
    assert "optim.lr=VALUE" in FLOAT_KEYS and "budget.wall_seconds=VALUE" in FLOAT_KEYS


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("override", FLOAT_KEYS)
def test_non_finite_numbers_are_rejected_naming_the_key(spec_file, override, value):
    with pytest.raises(SpecError) as err:
        load_spec(spec_file, ["learners={min: 1}", override.replace("VALUE", value)])  # tiny.yaml: learners: 1
    key = override.partition("=")[0]
    # "Input should be a finite number", or a bound's message where the field has both bounds
    assert re.search(rf"^{re.escape(str(spec_file))}: {re.escape(key)}(\.\w+)?( \(from --set\))?: Input should be",
                     str(err.value), re.M), str(err.value)


@pytest.mark.parametrize("overrides, expected", [
    (["seed=-1"], "seed (from --set): Input should be greater than or equal to 0"),
    (["name=.."], "name (from --set): must not be '.', '..' or other dots only"),
    (["name=."], "name (from --set): must not be '.', '..' or other dots only"),
    (["name=a/b"], "name (from --set): String should match pattern"),
    (["name=" + "x" * 300], "name (from --set): String should have at most"),
])
def test_seeds_and_names_that_cannot_run_are_rejected_naming_the_key(spec_file, overrides, expected):
    with pytest.raises(SpecError) as err:
        load_spec(spec_file, overrides)
    assert f"{spec_file}: {expected}" in str(err.value)


@pytest.mark.parametrize("override, problem", [
    ("optim.lr=[1, 2", "expected ',' or ']', but got '<stream end>' at line 1, column 6"),
    ("name=a: b: c", "mapping values are not allowed here at line 1, column 5"),
    ("seed=@x", "found character '@' that cannot start any token at line 1, column 1"),
])
def test_a_set_value_that_is_not_yaml_is_one_line_naming_the_key(spec_file, override, problem):
    """It was PyYAML's traceback."""
    key, _, value = override.partition("=")
    with pytest.raises(SpecError) as err:
        load_spec(spec_file, [override])
    assert str(err.value) == f"{spec_file}: --set {key}: {value!r} is not a YAML value ({problem})"


def test_a_key_that_would_break_the_line_is_shown_escaped(spec_file):
    with pytest.raises(SpecError) as err:
        load_spec(spec_file, ["optim.a\nb=1"])
    assert str(err.value) == f"{spec_file}: optim.a\\nb (from --set): unknown key"
