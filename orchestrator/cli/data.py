"""`chorus synth`, `features`, `shards` and `lm`: the workload's data tools, reached through the
workload registry (`orchestrator/workload.py`)."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.base import strict_json
from orchestrator.cli.app import main


@main.command()
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
    from orchestrator.workload import workload_part

    synthesize = workload_part("asr", "synthesize")
    try:
        summary = synthesize(out, utterances=utterances, eval_utterances=eval_utterances, seed=seed, workers=workers,
                             engines=engines, task=task, hours=hours, oov_share=oov_share)
    except workload_part("asr", "synth_error") as exc:  # a voice or an engine is missing
        raise click.ClickException(str(exc)) from None
    click.echo(strict_json.dumps(summary))


@main.command()
@click.argument("manifest", type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The features folder: a corpus source for data.train/dev/test (`features.json` and shards).")
@click.option("--mel-bins", default=80, show_default=True, help="Filterbank channels (features.num_mel_bins).")
@click.option("--shard-mb", default=64.0, show_default=True, help="Size of each shard file.")
def features(manifest, out, mel_bins, shard_mb):
    """Precompute the filterbanks of MANIFEST (a .jsonl manifest or a LibriSpeech-layout directory)
    into shards in OUT, which learners read instead of decoding audio."""
    from orchestrator.workload import workload_part

    write_shards = workload_part("asr", "features")
    click.echo(strict_json.dumps(write_shards(manifest, out, num_mel_bins=mel_bins, shard_mb=shard_mb)))


@main.command()
@click.argument("manifest", type=click.Path(exists=True, path_type=Path))
@click.option("--out", required=True, help="A folder or a URI pyarrow.fs opens (s3://bucket/path?endpoint_override=...).")
@click.option("--shard-mb", default=64.0, show_default=True, help="Audio bytes per shard.")
@click.option("--features", "mel_bins", type=click.IntRange(min=1), default=None,
              help="Also store each utterance's log-mel power of this many channels (features.num_mel_bins), "
                   "for learners with data.shard_features to read instead of decoding audio.")
def shards(manifest, out, shard_mb, mel_bins):
    """Pack MANIFEST's audio and transcripts into WebDataset-style tar shards at OUT (`shards.json`
    indexes them), for learners to stream."""
    from orchestrator.workload import workload_part

    try:
        click.echo(strict_json.dumps(workload_part("asr", "shards")(manifest, out, shard_mb=shard_mb,
                                                                    mel_bins=mel_bins)))
    except workload_part("asr", "input_error") as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@click.argument("text", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The ARPA file to write.")
@click.option("--order", default=3, show_default=True, type=click.IntRange(1, 6), help="The n-gram order.")
def lm(text, out, order):
    """Estimate a word n-gram language model (interpolated Kneser-Ney) of TEXT (a .jsonl manifest's
    transcripts, or a text file of one sentence a line) into OUT, for `decoding.kind: lm`."""
    from orchestrator.workload import workload_part

    try:
        click.echo(strict_json.dumps(workload_part("asr", "lm")(text, out, order)))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
