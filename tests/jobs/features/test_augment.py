"""Waveform augmentation (jobs/features/augment.py): each kind does what it says, seeded per (seed, epoch,
utterance), and only training batches see it."""

import pytest
import torch
import torchaudio.functional as AF

from jobs.features.augment import Augment, reverberate, speed_resampler, synthetic_rir
from jobs.features.filterbanks import Fbank
from jobs.sections import AugmentConfig, WorkloadConfig
from jobs.workload import AsrWorkload

pytestmark = pytest.mark.unit

KINDS = {"speed": {"speed_factors": [0.9, 1.0, 1.1]}, "noise": {"noise_prob": 1.0},
         "reverb": {"reverb_prob": 1.0}}


def _speech_like(seconds: float = 1.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(16_000 * seconds)) / 16_000
    return torch.sin(2 * torch.pi * 220 * t) * (0.5 + 0.5 * torch.rand(len(t), generator=g))


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_reproducible_from_seed_epoch_and_utterance_and_varies_with_them(kind):
    wave, augment = _speech_like(), Augment(AugmentConfig(**KINDS[kind]), seed=3)
    first = augment(wave, epoch=2, index=5)
    assert torch.equal(first, Augment(AugmentConfig(**KINDS[kind]), seed=3)(wave, epoch=2, index=5))
    others = [augment(wave, epoch, index) for epoch, index in [(e, 5) for e in range(3, 9)] + [(2, 6), (2, 7)]]
    others += [Augment(AugmentConfig(**KINDS[kind]), seed=4)(wave, 2, 5)]
    assert any(not torch.equal(first, other) for other in others)
    assert not torch.equal(first, wave) or kind == "speed"  # speed's 1.0 may leave it as it was


def test_switching_one_kind_on_leaves_what_the_others_do_unchanged():
    wave = _speech_like()
    reverb = Augment(AugmentConfig(speed_factors=[0.9, 1.1], reverb_prob=1.0), seed=1)(wave, 4, 9)
    noisy = Augment(AugmentConfig(speed_factors=[0.9, 1.1], reverb_prob=1.0, noise_prob=1.0, noise_snr_db=(20, 20)),
                    seed=1)(wave, 4, 9)
    assert noisy.shape == reverb.shape  # the same speed factor
    added = 10 * torch.log10(reverb.pow(2).mean() / (noisy - reverb).pow(2).mean())
    assert abs(float(added) - 20) < 0.01  # exactly the same reverberant speech, plus the noise


def test_speed_perturbation_resamples_by_its_factor():
    wave = _speech_like(2.0)
    for factor in (0.9, 1.1):
        out = Augment(AugmentConfig(speed_factors=[factor]))(wave, 0, 0)
        assert abs(len(out) - len(wave) / factor) <= 2
    factors = {len(Augment(AugmentConfig(speed_factors=[0.9, 1.0, 1.1]))(wave, epoch, 0)) for epoch in range(30)}
    assert len(factors) == 3  # all three are drawn


def test_the_fast_paths_compute_what_torchaudios_functions_do():
    """Speed perturbation with a kernel built once per factor, and reverberation by FFTs of a power
    of two, against torchaudio's `speed` and `fftconvolve` at odd lengths and every factor in use."""
    for seconds in (0.73, 1.0, 2.31):
        wave = _speech_like(seconds, seed=int(seconds * 100))
        for factor in (0.8, 0.9, 1.1, 1.2):
            expected = AF.speed(wave, 16_000, factor)[0]
            assert torch.allclose(speed_resampler(factor)(wave), expected, atol=1e-5)
        rir = synthetic_rir(0.37, torch.Generator().manual_seed(1))
        assert torch.allclose(reverberate(wave, rir), AF.fftconvolve(wave, rir)[: len(wave)], atol=1e-5)


def test_noise_is_added_at_the_drawn_snr():
    wave = _speech_like(2.0)
    for snr in (5.0, 20.0):
        out = Augment(AugmentConfig(noise_prob=1.0, noise_snr_db=(snr, snr)))(wave, 1, 1)
        measured = 10 * torch.log10(wave.pow(2).mean() / (out - wave).pow(2).mean())
        assert abs(float(measured) - snr) < 0.01
    assert torch.equal(Augment(AugmentConfig(noise_prob=0.0, reverb_prob=0.0, speed_factors=[1.0]))(wave, 1, 1), wave)


def test_reverb_keeps_length_and_loudness_and_adds_a_decaying_tail():
    click = torch.zeros(16_000)
    click[1000] = 1.0
    for rt60 in (0.2, 0.6):
        out = Augment(AugmentConfig(reverb_prob=1.0, reverb_rt60_s=(rt60, rt60)))(click, 0, 0)
        assert out.shape == click.shape
        assert torch.allclose(out.pow(2).mean(), click.pow(2).mean(), rtol=1e-4)
        assert float(out[:1000].abs().max()) < 1e-6 * float(out.abs().max())  # nothing before the sound (FFT round-off)
        tail = out[1100:]
        early, late = tail[: int(0.05 * 16_000)].pow(2).mean(), tail[int(rt60 * 16_000) - 800:].pow(2).mean()
        assert float(early) > 0 and float(late) < float(early) / 100  # -20 dB and more by the end of rt60


def test_vtlp_draws_a_seeded_factor_in_its_range_and_the_filterbank_moves_formants_by_it():
    augment = Augment(AugmentConfig(vtlp_warp=(0.8, 1.2)), seed=5)
    factors = [augment.warp(epoch, 3) for epoch in range(40)]
    assert factors == [Augment(AugmentConfig(vtlp_warp=(0.8, 1.2)), seed=5).warp(epoch, 3) for epoch in range(40)]
    assert all(0.8 <= f <= 1.2 for f in factors) and max(factors) - min(factors) > 0.3
    assert Augment(AugmentConfig()).warp(0, 0) == 1.0
    fbank = Fbank(80)
    plain = fbank.warped_filters(1.0)  # (FFT bins of 40 Hz, mel filters)
    assert torch.allclose(plain, fbank.filters, atol=1e-5)

    def peak_filter(hz: float, warp: float = 1.0) -> int:  # the mel filter that hears a tone at `hz` most
        return int(fbank.warped_filters(warp)[round(hz / 40)].argmax())

    for warp in (0.8, 1.2):  # below the 4.8 kHz knee a tone at f reads as one at warp * f
        assert peak_filter(1000, warp) == peak_filter(1000 * warp) != peak_filter(1000)
    speech = _speech_like()
    assert torch.equal(fbank(speech, 1.0), fbank(speech)) and not torch.allclose(fbank(speech, 1.2), fbank(speech))


def test_training_batches_are_augmented_and_evaluation_sees_none(corpus):
    def workload(**augment) -> AsrWorkload:
        return AsrWorkload(WorkloadConfig(data={"train": corpus / "train.jsonl", "dev": corpus / "dev.jsonl",
                                                "max_batch_seconds": 10, "prefetch_batches": 0},
                                          augment=augment), seed=0)

    everything = {"speed_factors": [0.9, 1.1], "noise_prob": 1.0, "reverb_prob": 1.0, "vtlp_warp": [0.8, 1.2]}
    clean, augmented, again = workload(), workload(**everything), workload(**everything)
    model = clean.build_model()
    assert augmented.evaluate(model, "dev") == clean.evaluate(model, "dev")  # evaluation reads clean audio
    batch, plain, repeat = (next(iter(w.batches(0, 1, epoch=0))) for w in (augmented, clean, again))
    assert batch.ids == plain.ids and batch.feats.shape != plain.feats.shape  # a speed factor != 1 for every one
    assert torch.equal(batch.feats, repeat.feats)  # another learner (process) would read the same
    i = augmented.train.utterances.index(next(u for u in augmented.train.utterances if u.id == batch.ids[0]))
    assert not torch.equal(augmented.train.features(i, epoch=0), augmented.train.features(i, epoch=1))
    assert torch.equal(augmented.train.features(i), clean.train.features(i))  # no epoch: clean
