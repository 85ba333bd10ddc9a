"""Transcribe audio files with the model exported beside this script (`chorus export`), with
nothing of Chorus installed: torch and soundfile only (and, for lexicon decoding, torchaudio's
flashlight-text beam search).

The folder holds `model.pt` (TorchScript: `resample`, `features` and the acoustic model),
`tokens.txt` (one output class a line, blank first), `config.json`, and where the checkpoint carried
them `lexicon.txt` (each word spelled in tokens) and `lm.arpa`. Utterances are batched as Chorus
batches them (by duration, then file name, within `max_batch_seconds`), so the texts are
`chorus transcribe --no-warps`'s for an fp32 model (a bf16-trained one runs in fp32 here, and its
texts may differ slightly from Chorus's, which runs it under bf16 autocast).

Usage: python transcribe.py AUDIO... [--decoding greedy|lexicon]   (one JSON line per file)
Or, from Python: Exported(folder).transcribe([path, ...]) -> texts.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import soundfile
import torch

HERE = Path(__file__).resolve().parent


class Exported:
    """The exported model in `folder`, ready to transcribe files."""

    def __init__(self, folder: str | Path = HERE, decoding: str = "greedy"):
        self.folder = Path(folder)
        self.config = json.loads((self.folder / "config.json").read_text())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load's notice of TorchScript's deprecation
            self.model = torch.jit.load(str(self.folder / "model.pt"), map_location="cpu").eval()
        self.tokens = (self.folder / "tokens.txt").read_text(encoding="utf-8").splitlines()
        self.decode = self._greedy if decoding == "greedy" else self._lexicon_search()

    def read(self, path: str | Path) -> tuple[torch.Tensor, float]:
        """A file's 16 kHz mono waveform and its seconds (from its header)."""
        samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        mono = torch.from_numpy(samples.mean(axis=1))
        rate_hz = int(self.config["sample_rate"])
        return (mono if rate == rate_hz else self.model.resample(mono, rate)), len(samples) / rate

    @torch.no_grad()
    def transcribe(self, paths: list[str | Path]) -> list[str]:
        waves, seconds = zip(*(self.read(p) for p in paths), strict=True) if paths else ((), ())
        order = sorted(range(len(paths)), key=lambda i: (seconds[i], Path(paths[i]).stem))
        texts = [""] * len(paths)
        for chunk in self._chunks(order, seconds):
            feats = [self.model.features(waves[i]) for i in chunk]
            padded = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
            log_probs, lengths = self.model(padded, torch.tensor([len(f) for f in feats]))
            for i, text in zip(chunk, self.decode(log_probs, lengths), strict=True):
                texts[i] = text
        return texts

    def _chunks(self, order: list[int], seconds) -> list[list[int]]:
        chunks, chunk = [], []
        for i in order:
            if chunk and (len(chunk) + 1) * seconds[i] > self.config["max_batch_seconds"]:
                chunks.append(chunk)
                chunk = []
            chunk.append(i)
        return chunks + [chunk] if chunk else chunks

    def _greedy(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        texts = []
        for row, n in zip(log_probs.argmax(dim=-1), lengths.tolist(), strict=True):
            ids = [i for i in torch.unique_consecutive(row[:n]).tolist() if i != 0]
            names = [self.tokens[i] for i in ids if not self.tokens[i].startswith("<unused-")]
            text = "".join(" \u2047 " if name == "<unk>" else name for name in names)
            texts.append(" ".join(text.replace(self.config["space"], " ").split()))
        return texts

    def _lexicon_search(self):
        from torchaudio.models.decoder import ctc_decoder  # flashlight-text's beam search

        if not (self.folder / "lexicon.txt").is_file():
            sys.exit("lexicon decoding: this export has no lexicon.txt (its checkpoint carried no words)")
        c = self.config["search"]
        search = ctc_decoder(lexicon=str(self.folder / "lexicon.txt"), tokens=self.tokens, beam_size=c["beam"],
                             beam_size_token=c["beam_tokens"], beam_threshold=c["beam_threshold"],
                             word_score=c["word_score"], blank_token=self.tokens[0],
                             sil_token=self.config["word_separator"], unk_word="<unk>")

        def decode(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
            best = search(log_probs.float().contiguous(), lengths.to(torch.int32))
            return [" ".join(hyps[0].words) if hyps else "" for hyps in best]
        return decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("audio", nargs="+")
    parser.add_argument("--decoding", choices=["greedy", "lexicon"], default="greedy")
    args = parser.parse_args()
    texts = Exported(HERE, args.decoding).transcribe(args.audio)
    for path, text in zip(args.audio, texts, strict=True):
        print(json.dumps({"path": path, "text": text}, allow_nan=False))


if __name__ == "__main__":
    main()
