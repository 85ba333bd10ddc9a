"""The ASR workload's data tools, as commands of `chorus` (the workload registry names this list as
`asr`'s `commands`; the CLI adds them to its group): `synth` (a speech corpus made here),
`features` (filterbanks precomputed into shards), `shards` (audio packed into tar shards, or
Lhotse Shar, at a folder or URI) and `lm` (a word n-gram language model). Each prints what it made as one JSON line.
Importing this module loads nothing but click: each command imports its tool when it runs."""

from __future__ import annotations

import json
from pathlib import Path

import click


def _json(summary: dict) -> str:
    """One line of JSON; a non-finite number is an error, not `NaN` (as everything Chorus prints)."""
    return json.dumps(summary, allow_nan=False)


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--utterances", default=2000, show_default=True, help="Training utterances.")
@click.option("--eval-utterances", type=int, default=None,
              help="Utterances in each of dev, test and test-unseen [default: max(20, utterances/10)].")
@click.option("--seed", default=0, show_default=True)
@click.option("--workers", type=int, default=None, help="Processes [default: CPU count].")
@click.option("--engines", type=click.Choice(["auto", "espeak", "espeak,festival", "espeak,festival,flite",
                                                 "espeak,festival,flite,world"]), default="auto", show_default=True,
              help="Speech engines: auto adds Festival (and test-unseen-engine) when its voices are installed; "
                   "flite's voices, and WORLD's conversions of them and Festival's, join training only when named.")
@click.option("--task", type=click.Choice(["commands", "openvocab"]), default="commands", show_default=True,
              help="commands: a 38-word vocabulary; openvocab: real English sentences (Debian's fortunes).")
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), default=None,
              help="About this much training speech, instead of --utterances.")
@click.option("--oov-share", type=click.FloatRange(0, 0.5), default=0.02, show_default=True,
              help="openvocab: share of test words held out of training text.")
def synth(out, utterances, eval_utterances, seed, workers, engines, task, hours, oov_share):
    """Synthesize an offline multi-voice, multi-engine speech corpus into OUT."""
    from jobs.synth.corpus import SynthError, synthesize

    try:
        summary = synthesize(out, utterances=utterances, eval_utterances=eval_utterances, seed=seed, workers=workers,
                             engines=engines, task=task, hours=hours, oov_share=oov_share)
    except SynthError as exc:  # a voice or an engine is missing
        raise click.ClickException(str(exc)) from None
    click.echo(_json(summary))


@click.command()
@click.argument("manifest", type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The features folder: a corpus source for data.train/dev/test (`features.json` and shards).")
@click.option("--mel-bins", default=80, show_default=True, help="Filterbank channels (features.num_mel_bins).")
@click.option("--shard-mb", default=64.0, show_default=True, help="Size of each shard file.")
def features(manifest, out, mel_bins, shard_mb):
    """Precompute the filterbanks of MANIFEST (a .jsonl manifest or a LibriSpeech-layout directory)
    into shards in OUT, which learners read instead of decoding audio."""
    from jobs.data.feature_shards import write_shards

    click.echo(_json(write_shards(manifest, out, num_mel_bins=mel_bins, shard_mb=shard_mb)))


@click.command()
@click.argument("manifest", type=click.Path(exists=True, path_type=Path))
@click.option("--out", required=True, help="A folder or a URI pyarrow.fs opens (s3://bucket/path?endpoint_override=...).")
@click.option("--shard-mb", default=64.0, show_default=True, help="Audio bytes per shard.")
@click.option("--features", "mel_bins", type=click.IntRange(min=1), default=None,
              help="Also store each utterance's log-mel power of this many channels (features.num_mel_bins), "
                   "for learners with data.shard_features to read instead of decoding audio.")
@click.option("--format", "shard_format", type=click.Choice(["chorus", "lhotse-shar"]), default="chorus",
              show_default=True,
              help="chorus: tar shards indexed by shards.json; lhotse-shar: Lhotse Shar (cuts.N.jsonl.gz, "
                   "recording.N.tar, FLAC audio), written by Lhotse's SharWriter.")
def shards(manifest, out, shard_mb, mel_bins, shard_format):
    """Pack MANIFEST's audio and transcripts into shards at OUT (a folder or URI), for learners to
    stream: WebDataset-style tar shards (`shards.json` indexes them) or Lhotse Shar."""
    from jobs.data.audio_shards import write_audio_shards
    from jobs.data.lhotse_corpora import write_shar
    from jobs.data.manifests import DataError

    if shard_format == "lhotse-shar" and mel_bins is not None:
        raise click.ClickException("--features: Lhotse Shar carries no Chorus features; leave it out")
    try:
        written = write_shar(manifest, out, shard_mb=shard_mb) if shard_format == "lhotse-shar" else \
            write_audio_shards(manifest, out, shard_mb=shard_mb, mel_bins=mel_bins)
    except DataError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(_json(written))


@click.command()
@click.argument("text", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The ARPA file to write.")
@click.option("--order", default=3, show_default=True, type=click.IntRange(1, 6), help="The n-gram order.")
def lm(text, out, order):
    """Estimate a word n-gram language model (interpolated Kneser-Ney) of TEXT (a .jsonl manifest's
    transcripts, or a text file of one sentence a line) into OUT, for `decoding.kind: lm`."""
    from jobs.ngram import write_lm

    try:
        click.echo(_json(write_lm(text, out, order)))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


COMMANDS = [synth, features, shards, lm]
