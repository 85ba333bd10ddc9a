import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from jobs.data.manifests import read_corpus
from jobs.tokenizer import BpeTokenizer, normalize
from orchestrator.checkpoint.files import load
from orchestrator.driver.job import TrainingJob
from tests.builders import SMALL_MODEL, make_spec, run_cli

SPLITS = ("train", "dev", "test/", "test_unseen")  # all four; test as its LibriSpeech-layout folder


@pytest.mark.slow
def test_short_training_run_lowers_the_loss(corpus, tmp_path):
    records = []
    engine = str(corpus / "test-unseen.jsonl")  # the session's corpus has no unseen-engine split: its unseen voices
    summary = TrainingJob(make_spec(corpus, *SPLITS, budget__epochs=12, data__test_unseen_engine=engine), tmp_path,
                          report=records.append).run()
    assert [r["epoch"] for r in records] == list(range(1, 13))
    # 12 short epochs just leave CTC's all-blank plateau: epoch-mean train loss 88 -> 58 and dev loss
    # 64 -> 55 when measured (make_spec's small BiLSTM)
    assert records[-1]["train_loss"] < 0.85 * records[0]["train_loss"]
    assert min(r["dev_loss"] for r in records[-3:]) < records[0]["dev_loss"] - 2.0
    assert summary["steps"] > 0 and summary["samples"] == 12 * 160
    for key in ("wer_test", "wer_test_unseen", "steps", "samples", "wall_s", "samples_per_s"):
        assert summary[key] is not None, key
    assert {summary[f"utterances_{split}"] for split in ("test", "test_unseen", "test_unseen_engine")} == {20}
    assert summary["wer_test_unseen_engine"] == summary["wer_test_unseen"]  # the same data, the same model
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert len((tmp_path / "evals.jsonl").read_text().splitlines()) == 12
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["learners"][0]["counters"]["step"] == summary["steps"] and state["spec"]["name"] == "t"


@pytest.mark.slow
def test_wall_budget_stops_the_job(corpus, tmp_path):
    summary = TrainingJob(make_spec(corpus, *SPLITS, data__max_batch_seconds=20,
                                   budget={"epochs": None, "wall_seconds": 3}), tmp_path).run()
    assert summary["train_wall_s"] < 3 + 15  # the step in flight and the last dev evaluation
    assert 0 < summary["samples"] < 50 * 160


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_cli_train_prints_evals_and_summary_last_then_eval_reads_checkpoint(corpus, tmp_path, tokenizer):
    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps(make_spec(corpus, *SPLITS, data__max_batch_seconds=20, budget__epochs=2,
                                         model={**SMALL_MODEL, "tokenizer": {"kind": tokenizer, "vocab": 48}},
                                         decoding={"kind": "lexicon", "warps": [0.9, 1.1]} if tokenizer == "bpe"
                                         else {"kind": "greedy"})
                               .model_dump(mode="json")))  # JSON is YAML
    out = tmp_path / "run"
    proc = run_cli("train", str(spec), "--set", "budget.epochs=1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("epoch 1  step ") and "dev_wer" in line for line in lines)
    summary = json.loads(lines[-1])
    assert summary == json.loads((out / "summary.json").read_text())
    evals = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(out / "tensorboard"))  # the run's pictures: TensorBoard's reader finds its curve
    events.Reload()
    assert [(e.step, round(e.value, 2)) for e in events.Scalars("dev_wer")] == [(r["samples"], r["dev_wer"])
                                                                               for r in evals]
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    proc = run_cli("eval", str(out / "checkpoint.pt"), str(corpus / "test"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["utterances"] == 20 and abs(result["wer"] - summary["wer_test"]) < 1e-6
    if tokenizer == "bpe":  # test-time warps: `chorus eval` averaged them as the job did; --no-warps reads once
        once = run_cli("eval", "--no-warps", str(out / "checkpoint.pt"), str(corpus / "test"))
        assert once.returncode == 0, once.stderr
        assert abs(json.loads(once.stdout.strip().splitlines()[-1])["loss"] - result["loss"]) > 1e-3
        greedy = run_cli("eval", "--decoding", "greedy", str(out / "checkpoint.pt"), str(corpus / "test"))
        assert greedy.returncode == 0 and ", CER " in greedy.stdout, greedy.stderr
        decoded = json.loads(greedy.stdout.strip().splitlines()[-1])
        assert decoded["loss"] == result["loss"] and decoded["cer"] is not None  # the same model, decoded otherwise
        assert run_cli("features", str(corpus / "test.jsonl"), "--out", str(tmp_path / "feats")).returncode == 0
        refused = run_cli("eval", str(out / "checkpoint.pt"), str(tmp_path / "feats"))  # no audio to warp
        assert refused.returncode == 1 and refused.stderr.strip() == (
            "Error: decoding.warps reads each utterance's audio through warped filterbanks: "
            f"{tmp_path / 'feats'} is a features folder; set decoding.warps to null (chorus eval: --no-warps) "
            "or name the audio's manifest")
    # the checkpoint that `chorus eval` read carries the units the run learnt from its training transcripts
    state = load(out / "checkpoint.pt").state
    saved = state["tokenizer"]
    assert saved["kind"] == tokenizer
    if tokenizer == "bpe":  # and, decoding through a lexicon (as `chorus eval` did above), the training words
        texts = [u.text for u in read_corpus(corpus / "train.jsonl")[0]]
        assert saved["model"] == BpeTokenizer.train(texts, 48).model
        assert state["lexicon"] == sorted({w for t in texts for w in normalize(t).split()})
    else:
        assert "lexicon" not in state


@pytest.mark.unit
def test_cli_rejects_a_bad_spec_before_training(stub_corpus, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps(make_spec(stub_corpus, *SPLITS, data__max_batch_seconds=20).model_dump(mode="json")))
    proc = run_cli("train", str(spec), "--set", "model.hiden=64", "--out", str(tmp_path / "run"))
    assert proc.returncode != 0
    assert f"{spec}: model.hiden (from --set): unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.unit
def test_learner_gradients_share_one_buffer_and_its_state_is_a_snapshot(corpus):
    from orchestrator.learner.replica import Learner
    from orchestrator.service.shards import ShardPlanner

    raw = make_spec(corpus, *SPLITS).workload_config.model_dump(mode="json")
    learner = Learner("asr", raw, seed=0, learner_id=0, planner=ShardPlanner([0]))
    batch = learner.next_batch()
    learner.forward_backward(batch)
    # backward accumulated into the flat buffer the groups all-reduce, not into new tensors
    buffer = learner.grad_buffer.untyped_storage().data_ptr()
    assert all(p.grad.untyped_storage().data_ptr() == buffer for p in learner.params)
    assert float(learner.flat_grads().abs().sum()) > 0
    snapshot = learner.state()
    before = {k: v.clone() for k, v in snapshot["model"].items()}
    learner.apply_step(1.0, batch.size)
    after = learner.state()
    assert after["counters"]["step"] == 1 and after["counters"]["position"] == 1
    assert snapshot["counters"]["step"] == 0 and snapshot["counters"]["position"] == 0
    assert all(torch.equal(before[k], v) for k, v in snapshot["model"].items())  # the snapshot did not move
    assert not all(torch.equal(before[k], v) for k, v in after["model"].items())  # the model did
