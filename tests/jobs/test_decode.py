"""Decoding (jobs/decode.py): a lexicon decoder outputs only the training transcripts' words, turns a
near miss into the word it missed, and a checkpoint carries its words, so a reloaded model decodes
through the same lexicon whatever data the reader was built on. Test-time warps (`decoding.warps`)
average the posteriors of each warped reading of an utterance, and leave `dev` alone."""

import io
import json

import pytest
import torch
from pydantic import ValidationError

from jobs.data.manifests import load_audio, read_corpus
from jobs.decode import greedy_decode
from jobs.features.filterbanks import Fbank
from jobs.models import ctc_loss
from jobs.sections import DecodingConfig, WorkloadConfig
from jobs.tokenizer import normalize
from jobs.workload import AsrWorkload

pytestmark = pytest.mark.unit

UNITS = {"char": {"kind": "char"}, "bpe": {"kind": "bpe", "vocab": 48}}


def _workload(train, units: str, kind: str = "lexicon") -> AsrWorkload:
    return AsrWorkload(WorkloadConfig(data={"train": train, "dev": train.parent / "dev.jsonl", "max_batch_seconds": 10},
                                      model={"tokenizer": UNITS[units]}, decoding={"kind": kind, "beam": 8}), seed=0)


def _emissions(units: list[int], classes: int) -> torch.Tensor:
    """Log-probabilities that say each of `units` for two frames, then blank for one; blank is every
    frame's second guess, and anything else unlikely."""
    frames = torch.tensor([f for unit in units for f in (unit, unit, 0)])
    log_probs = torch.full((1, len(frames), classes), -8.0)
    log_probs[..., 0] = -3.0
    log_probs[0, torch.arange(len(frames)), frames] = -0.05
    return log_probs.log_softmax(-1)


@pytest.mark.parametrize("units", UNITS)
def test_lexicon_decoding_outputs_training_words_only_and_mends_a_near_miss(corpus, units):
    w = _workload(corpus / "train.jsonl", units)
    words = {word for u in read_corpus(corpus / "train.jsonl")[0] for word in normalize(u.text).split()}
    assert set(w.lexicon) == words
    model = w.build_model()  # untrained: its guesses are noise, and still only words of the lexicon
    log_probs, lengths = model(torch.randn(3, 200, 80), torch.tensor([200, 180, 120]))
    assert all(set(text.split()) <= words for text in w.decode(log_probs, lengths))
    assert w.evaluate(model, "dev")["utterances"] == 20
    # a near miss: "forward" heard as "forwarb": greedy writes the non-word, the lexicon the word
    log_probs = _emissions(w.tokenizer.encode("go forwarb left").tolist(), model.out.out_features)
    frames = torch.tensor([log_probs.shape[1]])
    assert greedy_decode(log_probs, frames, w.tokenizer) == ["go forwarb left"]
    assert w.decode(log_probs, frames) == ["go forward left"]

def test_a_checkpoint_carries_its_lexicon_and_decodes_after_reload(corpus, tmp_path):
    trained = _workload(corpus / "train.jsonl", "bpe")
    model = trained.build_model()
    buffer = io.BytesIO()
    torch.save(trained.state_dict(model), buffer)
    # a reader built over two utterances would know only their words
    lines = (corpus / "train.jsonl").read_text().splitlines()[:2]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps({**json.loads(line), "audio_filepath": str(
        (corpus / json.loads(line)["audio_filepath"]).resolve())}) for line in lines) + "\n")
    (tmp_path / "dev.jsonl").write_text((tmp_path / "train.jsonl").read_text())
    assert set(_workload(tmp_path / "train.jsonl", "bpe").lexicon) < set(trained.lexicon)
    reader = _workload(tmp_path / "train.jsonl", "bpe")
    reloaded = reader.build_model()
    reader.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True), reloaded)
    assert reader.lexicon == trained.lexicon
    model.eval(), reloaded.eval()
    feats, lengths = torch.randn(4, 300, 80), torch.tensor([300, 260, 200, 150])
    assert reader.decode(*reloaded(feats, lengths)) == trained.decode(*model(feats, lengths))
    greedy = _workload(corpus / "train.jsonl", "bpe", kind="greedy")
    assert "lexicon" not in greedy.state_dict(greedy.build_model())  # greedy decoding needs none


def test_test_time_warps_average_each_warped_readings_posteriors_and_leave_dev_alone(corpus):
    warps = [0.85, 1.15]
    w = AsrWorkload(WorkloadConfig(data={"train": corpus / "train.jsonl", "dev": corpus / "dev.jsonl"},
                                   decoding={"warps": warps}), seed=0)
    model = w.build_model().eval()
    utterances = read_corpus(corpus / "dev.jsonl")[0]
    fbank = Fbank(w.config.features.num_mel_bins)
    expected = []  # each utterance alone: the mean of its warped readings' probabilities
    with torch.no_grad():
        for u in utterances:
            wave = load_audio(u.path)
            outputs = [model(fbank(wave, warp=a)[None], torch.tensor([len(fbank(wave))])) for a in warps]
            log_probs = torch.logsumexp(torch.stack([lp for lp, _ in outputs]), dim=0) - torch.log(torch.tensor(2.0))
            target = w.tokenizer.encode(u.text)
            expected.append(ctc_loss(log_probs, outputs[0][1], target, torch.tensor([len(target)])).item())
    warped = w.evaluate(model, corpus / "dev.jsonl")  # as the test splits and `chorus eval` are
    assert warped["utterances"] == len(utterances) == 20
    assert warped["loss"] == pytest.approx(sum(expected) / len(expected), rel=1e-4)
    unwarped = AsrWorkload(w.config.model_copy(update={"decoding": DecodingConfig()}), seed=0)
    assert w.evaluate(model, "dev") == unwarped.evaluate(model, corpus / "dev.jsonl")  # dev while training: one pass
    assert abs(warped["loss"] - unwarped.evaluate(model, "dev")["loss"]) > 1e-3  # (evaluation is deterministic)
    with pytest.raises(ValidationError, match=r"warp factors must lie in \[0.5, 2.0\], got \[0.3\]"):
        DecodingConfig(warps=[0.3])


def test_an_utterance_unreadable_at_one_warp_leaves_every_warps_batch(corpus, tmp_path):
    lines = [json.loads(line) for line in (corpus / "dev.jsonl").read_text().splitlines()[:3]]
    for i, line in enumerate(lines):  # copies of three utterances' audio, each named by its index
        audio = (corpus / line["audio_filepath"]).resolve()
        line["audio_filepath"] = str(tmp_path / f"{i}{audio.suffix}")
        (tmp_path / f"{i}{audio.suffix}").write_bytes(audio.read_bytes())
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    w = AsrWorkload(WorkloadConfig(data={"train": corpus / "train.jsonl", "dev": tmp_path / "dev.jsonl"}), seed=0)
    dev = w.corpus(tmp_path / "dev.jsonl")
    assert dev.collate([0, 1, 2]).size == 3  # clean features, read and kept
    broken = tmp_path / lines[1]["audio_filepath"].rsplit("/", 1)[1]
    broken.write_bytes(broken.read_bytes()[:100])  # the file breaks after its clean features were read
    batches = dev.warped([0, 1, 2], [1.0, 0.9, 1.1])
    assert [b.ids for b in batches] == [[dev.utterances[0].id, dev.utterances[2].id]] * 3
    assert [b.feats.shape for b in batches[1:]] == [batches[0].feats.shape] * 2
    assert dev.skipped.keys == [str(broken)]  # named once, as every skip is
