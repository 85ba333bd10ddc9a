"""What the ASR workload computes from audio: log-mel filterbanks, normalization, VTLP and
SpecAugment (`filterbanks`), waveform augmentation drawn per (seed, epoch, utterance) (`augment`),
augmentation of precomputed log-mels (`mel_augment`), and all of it batched on a learner's device
(`device`)."""
