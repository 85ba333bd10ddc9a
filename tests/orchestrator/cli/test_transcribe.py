"""`chorus transcribe` on a trained run's checkpoint: the WER of its output equals `chorus eval`'s with
the same decoding (greedy and lexicon), lines come in the input's order with a totals line last, what
cannot be read is counted by reason, and nothing to transcribe is one line; `orchestrator.Recognizer`'s
example runs on the same checkpoint."""

import doctest
import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

import orchestrator.checkpoint.trained
from jobs.wer import word_error_rate
from tests.builders import make_spec, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("transcribe-run")]  # one worker: the module's trained run


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    """A run trained for one epoch on four utterances, decoding through a lexicon (so its checkpoint
    carries the words): still all but untrained, so its greedy texts are letters, not nothing."""
    folder = tmp_path_factory.mktemp("transcribe")
    lines = (corpus / "train.jsonl").read_text().splitlines()[:4]
    (folder / "train.jsonl").write_text("".join(
        json.dumps({**json.loads(line), "audio_filepath": str(corpus / json.loads(line)["audio_filepath"])}) + "\n"
        for line in lines))
    spec = make_spec(corpus, decoding={"kind": "lexicon", "beam": 8}, raw=True)
    spec["data"]["train"] = str(folder / "train.jsonl")
    (folder / "job.yaml").write_text(json.dumps(spec))
    proc = run_cli("train", str(folder / "job.yaml"), "--out", str(folder / "run"))
    assert proc.returncode == 0, proc.stderr
    return folder / "run"


@pytest.mark.parametrize("decoding", ["greedy", "lexicon"])
def test_the_wer_of_the_transcripts_is_chorus_evals(run, corpus, tmp_path, decoding):
    out = tmp_path / "test.txt.jsonl"
    proc = run_cli("transcribe", str(run / "checkpoint.pt"), str(corpus / "test.jsonl"), "--decoding", decoding,
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    records, totals = lines[:-1], lines[-1]["totals"]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == lines[-1]
    manifest = [json.loads(line) for line in (corpus / "test.jsonl").read_text().splitlines()]
    assert [r["path"] for r in records] == [str((corpus / m["audio_filepath"]).resolve()) for m in manifest]
    assert set(records[0]) == {"id", "path", "duration", "text", "reference"}
    assert sum(r["text"] != "" for r in records) >= len(records) // 2  # texts to compare, not nothing
    evaluated = run_cli("eval", str(run / "checkpoint.pt"), str(corpus / "test.jsonl"), "--decoding", decoding)
    assert evaluated.returncode == 0, evaluated.stderr
    wer = json.loads(evaluated.stdout.strip().splitlines()[-1])["wer"]
    assert word_error_rate([r["reference"] for r in records], [r["text"] for r in records]) == wer == totals["wer"]
    assert totals["utterances"] == len(records) == 20 and totals["skipped_total"] == 0
    assert totals["audio_hours"] == pytest.approx(sum(r["duration"] for r in records) / 3600)
    assert totals["real_time_factor"] == pytest.approx(totals["wall_s"] / (totals["audio_hours"] * 3600))
    assert "audio h/s" in proc.stderr and "utt" in proc.stderr  # the progress bar


def test_unusable_inputs_are_counted_and_nothing_usable_is_one_line(run, corpus, tmp_path):
    (tmp_path / "noise.wav").write_bytes(b"RIFF but no audio")
    (tmp_path / "empty.flac").write_bytes(b"")
    proc = run_cli("transcribe", str(run / "checkpoint.pt"), str(tmp_path))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"Error: nothing to transcribe in {tmp_path}: 2 skipped (empty audio file: 1, unreadable audio file: 1)")
    first = json.loads((corpus / "dev.jsonl").read_text().splitlines()[0])
    proc = run_cli("transcribe", str(run / "checkpoint.pt"), str(tmp_path), str(corpus / first["audio_filepath"]))
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert len(lines) == 2 and "reference" not in lines[0] and lines[0]["id"] == first["audio_filepath"].split(
        "/")[-1].rsplit(".", 1)[0]
    assert lines[1]["totals"]["skipped"] == {"empty audio file": 1, "unreadable audio file": 1}
    assert lines[1]["totals"]["wer"] is None
    refused = run_cli("transcribe", str(run / "checkpoint.pt"), str(tmp_path), "--decoding", "lm")
    assert refused.returncode == 1 and "carries no language model" in refused.stderr.strip().splitlines()[-1]
    from orchestrator.cluster.local_head import free_port

    nobody = f"127.0.0.1:{free_port()}"
    refused = run_cli("transcribe", str(run / "checkpoint.pt"), str(corpus / first["audio_filepath"]), "--address",
                      nobody, timeout=60)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith(f"Error: --address {nobody}: no Ray cluster there")


def test_the_export_runs_without_chorus_and_transcribes_as_chorus_does(run, corpus, tmp_path):
    exported = tmp_path / "exported"
    proc = run_cli("export", str(run / "checkpoint.pt"), "--out", str(exported))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["files"] == ["config.json", "lexicon.txt", "model.pt", "tokens.txt", "transcribe.py"]
    assert summary["decoding"] == ["greedy", "lexicon"]
    manifest = [json.loads(line) for line in (corpus / "test.jsonl").read_text().splitlines()]
    audio = [str((corpus / m["audio_filepath"]).resolve()) for m in manifest]
    assert len(audio) == 20
    site = next(p for p in sys.path if p.endswith("site-packages"))  # torch and soundfile, but not the .pth
    # files that put Chorus's packages on the path (its editable install's finder)
    fresh = ("import importlib.util, runpy, sys\n"
             f"sys.path.append({site!r})\n"
             "assert importlib.util.find_spec('jobs') is None and importlib.util.find_spec('orchestrator') is None\n"
             f"sys.argv = ['transcribe.py', *{audio!r}]\n"
             "runpy.run_path('transcribe.py', run_name='__main__')\n")
    alone = subprocess.run([sys.executable, "-I", "-S", "-c", fresh], cwd=exported, capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"})
    assert alone.returncode == 0, alone.stderr
    texts = [json.loads(line) for line in alone.stdout.strip().splitlines()]
    chorus = run_cli("transcribe", str(run / "checkpoint.pt"), str(corpus / "test.jsonl"), "--decoding", "greedy")
    assert chorus.returncode == 0, chorus.stderr
    expected = [json.loads(line) for line in chorus.stdout.strip().splitlines()[:-1]]
    assert [t["path"] for t in texts] == [e["path"] for e in expected] == audio
    assert [t["text"] for t in texts] == [e["text"] for e in expected]
    assert sum(t["text"] != "" for t in texts) >= 10  # texts to compare, not nothing


def test_the_recognizer_example_runs(run, corpus):
    wav = corpus / json.loads((corpus / "dev.jsonl").read_text().splitlines()[0])["audio_filepath"]
    results = doctest.testmod(orchestrator.checkpoint.trained, extraglobs={"run": run, "wav": wav},
                              raise_on_error=True)
    assert results.attempted == 2
    from orchestrator import Recognizer

    recognizer = Recognizer.load(run, decoding="greedy")
    assert recognizer.transcribe([wav]) == recognizer.transcribe([str(wav)])


def test_on_ray_actors_give_the_lines_and_skips_given_here(run, corpus, tmp_path):
    """On Ray the driver lists the inputs and the actors probe them: the same lines, the same skips
    by reason, and a folder of nothing usable is the same one line, here and on Ray (a file whose
    header reads but whose samples do not is found only once read)."""
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "noise.wav").write_bytes(b"RIFF but no audio")
    (tmp_path / "bad" / "empty.flac").write_bytes(b"")
    sf.write(tmp_path / "bad" / "nan.wav", np.full(16000, np.nan, dtype=np.float32), 16000, subtype="FLOAT")
    inputs = [str(tmp_path / "bad"), str(corpus / "test.jsonl")]
    here = run_cli("transcribe", str(run / "checkpoint.pt"), *inputs, "--out", str(tmp_path / "here.jsonl"))
    on_ray = run_cli("transcribe", str(run / "checkpoint.pt"), *inputs, "--actors", "2", "--out",
                     str(tmp_path / "ray.jsonl"))
    assert here.returncode == 0 and on_ray.returncode == 0, here.stderr + on_ray.stderr
    lines = {name: [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
             for name in ("here", "ray")}
    assert lines["ray"][:-1] == lines["here"][:-1] and len(lines["here"]) == 21  # texts and durations too
    totals = {name: lines[name][-1]["totals"] for name in lines}
    assert totals["ray"]["skipped"] == totals["here"]["skipped"] == {"empty audio file": 1, "unreadable audio file": 2}
    assert totals["ray"]["wer"] == totals["here"]["wer"]
    for where in ([], ["--actors", "1"]):
        out = tmp_path / f"nothing{len(where)}.jsonl"
        nothing = run_cli("transcribe", str(run / "checkpoint.pt"), str(tmp_path / "bad"), *where, "--out", str(out))
        assert nothing.returncode == 1 and "Traceback" not in nothing.stderr
        assert nothing.stderr.strip().splitlines()[-1] == (f"Error: nothing to transcribe in {tmp_path / 'bad'}: "
                                                           "3 skipped (unreadable audio file: 2, empty audio file: 1)")
        assert not out.exists()  # no empty output left behind
