import pytest
import torch

from jobs.decode import greedy_decode
from jobs.models import ModelConfig, build_model, count_parameters, ctc_loss
from jobs.tokenizer import CharTokenizer
from jobs.wer import word_error_rate


def test_tokenizer_round_trip_and_normalization():
    tok = CharTokenizer()
    assert tok.vocab_size == 29
    assert tok.decode(tok.encode("  GO   left ")) == "go left"
    assert 0 not in tok.encode("stop").tolist()


def test_greedy_decode_collapses_repeats_and_blanks():
    tok = CharTokenizer()
    ids = [0, *tok.encode("g").tolist() * 2, 0, *tok.encode("o").tolist(), 0, 0, *tok.encode("o").tolist()]
    log_probs = torch.full((1, len(ids), tok.vocab_size), -10.0)
    log_probs[0, torch.arange(len(ids)), torch.tensor(ids)] = 0.0
    assert greedy_decode(log_probs, torch.tensor([len(ids)]), tok) == ["goo"]
    assert greedy_decode(log_probs, torch.tensor([3]), tok) == ["g"]


def test_wer_is_percent_from_jiwer():
    assert word_error_rate(["go left", "stop"], ["go right", "stop"]) == pytest.approx(100 / 3)
    assert word_error_rate(["yes no"], [""]) == 100.0
    with pytest.raises(ValueError):
        word_error_rate(["a"], [])


@pytest.mark.parametrize("kind, low, high", [("bilstm_ctc", 0.8e6, 1.3e6), ("conformer_ctc", 1e5, 5e6)])
def test_models_shapes_lengths_and_size(kind, low, high):
    model = build_model(ModelConfig(kind=kind), in_bins=80, vocab_size=29)
    assert low <= count_parameters(model) <= high
    feats = torch.randn(3, 401, 80)
    lengths = torch.tensor([401, 300, 57])
    log_probs, out_lengths = model(feats, lengths)
    assert out_lengths.tolist() == [99, 74, 13]  # time subsampled by 4
    assert log_probs.shape == (3, 99, 29)
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(3, 99), atol=1e-4)
    targets = torch.randint(1, 29, (12,))
    loss = ctc_loss(log_probs, out_lengths, targets, torch.tensor([5, 4, 3]))
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
