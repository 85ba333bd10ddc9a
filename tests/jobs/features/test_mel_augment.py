"""Augmentation in the log-mel domain (jobs/features/mel_augment.py), for shards that carry features: each
kind does to an utterance's precomputed log-mel power what it does to its waveform's filterbank
(speed, VTLP, a room, noise; compared on synthesized speech), from the same choices, the same
for the same (epoch, utterance) and new each epoch."""

import pytest
import torch

from jobs.data.manifests import load_audio, read_corpus
from jobs.features.augment import Augment
from jobs.features.filterbanks import Fbank
from jobs.features.mel_augment import MelAugment
from jobs.sections import AugmentConfig

pytestmark = pytest.mark.unit

KINDS = {"slower": {"speed_factors": [0.9]}, "faster": {"speed_factors": [1.1]}, "vtlp": {"vtlp_warp": [0.85, 0.85]},
         "room": {"reverb_prob": 1.0, "reverb_rt60_s": [0.5, 0.5]}}


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    n = min(len(a), len(b))
    return torch.corrcoef(torch.stack([a[:n].flatten(), b[:n].flatten()]))[0, 1].item()


def _both_paths(corpus, config: dict, utterances: int = 12):
    """(waveform path's features, log-mel path's, clean features) of the first utterances."""
    fbank, augment = Fbank(40), Augment(AugmentConfig(**config), seed=0)
    mel = MelAugment(augment, fbank)
    out = []
    for i, utt in enumerate(read_corpus(corpus / "train.jsonl")[0][:utterances]):
        waveform = load_audio(utt.path)
        on_wave = fbank(augment(waveform, 0, i), warp=augment.warp(0, i))
        on_mel = mel(fbank.log_mel(waveform), float(waveform.pow(2).mean()), 0, i)
        out.append((on_wave, on_mel, fbank(waveform)))
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_moves_the_log_mel_power_as_it_moves_the_waveforms_filterbank(corpus, kind):
    agree = []
    for on_wave, on_mel, clean in _both_paths(corpus, KINDS[kind]):
        assert abs(len(on_wave) - len(on_mel)) <= 1  # speed: the same frames
        # on every utterance the two paths agree better than the augmented one with the clean one
        agree.append(_corr(on_wave, on_mel))
        assert agree[-1] > _corr(on_wave, clean) + 0.1, kind
    assert sum(agree) / len(agree) >= 0.9, (kind, agree)  # measured: 0.95-0.99


def test_noise_at_an_snr_hides_as_much_of_the_speech_in_both_domains(corpus):
    for snr, change in ((10, 0.15), (30, 0.02)):
        pairs = _both_paths(corpus, {"noise_prob": 1.0, "noise_snr_db": [snr, snr]})
        on_wave = sum(_corr(w, c) for w, _, c in pairs) / len(pairs)
        on_mel = sum(_corr(m, c) for _, m, c in pairs) / len(pairs)
        assert abs(on_wave - on_mel) <= 0.05, (snr, on_wave, on_mel)
        assert 1 - on_mel >= change if snr == 10 else 1 - on_mel <= change, (snr, on_mel)


def test_the_same_utterance_and_epoch_get_the_same_augmentation_and_a_new_epoch_another():
    config = AugmentConfig(speed_factors=[0.9, 1.0, 1.1], noise_prob=0.5, reverb_prob=0.5, vtlp_warp=[0.9, 1.1])
    mel = MelAugment(Augment(config, seed=3), Fbank(40))
    log_mel = torch.randn(300, 40)
    assert torch.equal(mel(log_mel, 0.01, 2, 5), mel(log_mel, 0.01, 2, 5))
    assert not any(torch.equal(mel(log_mel, 0.01, 2, 5)[:250], mel(log_mel, 0.01, e, 5)[:250]) for e in (0, 1, 3))
