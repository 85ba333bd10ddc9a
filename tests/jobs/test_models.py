import pytest
import torch

from jobs.decode import greedy_decode
from jobs.models import build_model, count_parameters, ctc_loss
from jobs.sections import ModelConfig
from jobs.tokenizer import CharTokenizer
from jobs.wer import character_error_rate, word_error_rate

pytestmark = pytest.mark.unit


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


def test_cer_counts_character_edits_over_reference_characters():
    assert character_error_rate(["go left"], ["go lift"]) == pytest.approx(100 / 7)
    assert character_error_rate(["ab", "cd"], ["ab", ""]) == pytest.approx(50.0)
    with pytest.raises(ValueError):
        character_error_rate(["a"], [])


def expected_parameters(cfg: ModelConfig, in_bins: int, vocab_size: int) -> int:
    """The parameter count of a model, by formula from the config's dimensions: every layer's
    weights and biases."""
    c, d = cfg.subsample_channels, cfg.d_model
    bins = ((in_bins - 1) // 2 - 1) // 2  # after two unpadded 3x3 stride-2 convolutions
    count = (9 * c + c) + (9 * c * c + c) + (c * bins * d + d) + 2 * d  # conv, conv, projection, LayerNorm
    if cfg.kind == "bilstm_ctc":
        h = cfg.hidden  # per direction and layer: 4 gates over the input and the state, two biases each
        count += sum(2 * (4 * h * (d if layer == 0 else 2 * h) + 4 * h * h + 8 * h) for layer in range(cfg.layers))
        return count + 2 * h * vocab_size + vocab_size
    f, k = cfg.ffn_dim, cfg.conv_kernel
    feed_forward = 2 * d + (d * f + f) + (f * d + d)  # LayerNorm, Linear, Linear
    attention = 2 * d + (3 * d * d + 3 * d) + (d * d + d)  # LayerNorm, in- and out-projections
    convolution = 2 * d + (2 * d * d + 2 * d) + (d * k + d) + 2 * d + (d * d + d)  # LN, 1x1, depthwise, BN, 1x1
    block = 2 * feed_forward + attention + convolution + 2 * d  # and the final LayerNorm
    return count + cfg.layers * block + d * vocab_size + vocab_size


# at the defaults, as stated (by hand from the formula): about 1.1M parameters each
@pytest.mark.parametrize("kind, parameters", [("bilstm_ctc", 1_115_501), ("conformer_ctc", 1_068_573)])
def test_models_shapes_lengths_and_size(kind, parameters):
    model = build_model(ModelConfig(kind=kind), in_bins=80, vocab_size=29)
    assert count_parameters(model) == expected_parameters(ModelConfig(kind=kind), 80, 29) == parameters
    # every dimension of the config reaches the model
    other = ModelConfig(kind=kind, subsample_channels=8, d_model=48, hidden=40, layers=3, heads=2, ffn_dim=96,
                        conv_kernel=7)
    assert count_parameters(build_model(other, in_bins=40, vocab_size=31)) == expected_parameters(other, 40, 31)
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
