"""Tokenizers (jobs/tokenizer.py): the BPE one is learnt the same way on every learner, round-trips
the corpus's text, and a checkpoint carries it, so a reloaded model decodes with its own units."""

import io

import pytest
import torch

from jobs.data.manifests import read_corpus
from jobs.sections import WorkloadConfig
from jobs.tokenizer import BpeTokenizer, CharTokenizer, normalize
from jobs.workload import AsrWorkload

pytestmark = pytest.mark.unit


def test_bpe_is_the_same_on_every_learner_round_trips_and_fits_its_vocab(corpus):
    texts = [u.text for u in read_corpus(corpus / "train.jsonl")[0]]
    first, second = BpeTokenizer.train(texts, vocab=64), BpeTokenizer.train(texts, vocab=64)
    assert first.model == second.model
    for text in [u.text for u in read_corpus(corpus / "test.jsonl")[0]]:
        ids = first.encode(text)
        assert first.decode(ids) == normalize(text)
        assert 1 not in ids.tolist()  # no <unk>: every character of the text is in some piece
        assert len(ids) < len(CharTokenizer().encode(text))  # subwords: fewer units than characters
    with pytest.raises(ValueError, match="no transcripts"):
        BpeTokenizer.train(["!!", ""], vocab=32)


def test_a_bpe_checkpoint_decodes_after_reload_with_its_own_tokenizer(corpus):
    def workload(train: str) -> AsrWorkload:
        return AsrWorkload(WorkloadConfig(data={"train": corpus / train, "max_batch_seconds": 10},
                                          model={"tokenizer": {"kind": "bpe", "vocab": 48}}), seed=0)

    trained = workload("train.jsonl")
    model = trained.build_model()
    assert model.out.out_features == 49
    buffer = io.BytesIO()
    torch.save(trained.state_dict(model), buffer)
    # `chorus eval` builds its workload over the data it scores, whose transcripts would make other units
    reader = workload("test-unseen.jsonl")
    texts = [u.text for u in read_corpus(corpus / "dev.jsonl")[0]]
    assert any(not torch.equal(reader.tokenizer.encode(t), trained.tokenizer.encode(t)) for t in texts)
    reader = workload("test-unseen.jsonl")
    reloaded = reader.build_model()
    reader.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True), reloaded)
    assert reader.tokenizer.model == trained.tokenizer.model
    assert all(reader.tokenizer.decode(trained.tokenizer.encode(t)) == normalize(t) for t in texts)
    feats = torch.randn(2, 300, 80)
    lengths = torch.tensor([300, 250])
    model.eval(), reloaded.eval()
    assert torch.equal(model(feats, lengths)[0], reloaded(feats, lengths)[0])
