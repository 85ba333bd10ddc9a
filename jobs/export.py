"""`chorus export`: a trained speech model as a folder a service can run without Chorus — the model as
TorchScript (resampling, filterbanks and the acoustic model in one file that `torch.jit.load` runs
with no Python source), its output units (`tokens.txt`), its lexicon and language model where the
checkpoint carries them, `config.json`, and `transcribe.py` (`jobs/exported/transcribe.py`), a
script of its own that batches and decodes as Chorus does.

Why TorchScript and not ONNX: both model kinds script as they are (torchaudio's Conformer and
MelSpectrogram are written to be scriptable), with the utterance lengths dynamic, and the file
runs on CPU or GPU with torch alone; ONNX would need its exporter to cope with the Conformer's
length-dependent slicing and the STFT. TorchScript is deprecated upstream in favour of
torch.export, which has no loader without a compiler yet; this is the part to change then.

Example:
    >>> export(state, Path("exported"))  # doctest: +SKIP
    {'out': 'exported', 'files': ['config.json', 'model.pt', 'tokens.txt', 'transcribe.py'], ...}
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import torch
import torchaudio
from torch import Tensor, nn

from jobs.data.manifests import SAMPLE_RATE
from jobs.features.filterbanks import FLOOR, normalized
from jobs.ngram import UNK
from jobs.recognizer import SpeechRecognizer
from jobs.tokenizer import BpeTokenizer

SCRIPT = Path(__file__).parent / "exported" / "transcribe.py"


class ExportedModel(nn.Module):
    """What `model.pt` holds: `resample(waveform, rate)` to 16 kHz, `features(waveform)` (Chorus's
    normalized log-mel frames) and `forward(feats, lengths)`, the acoustic model's log-posteriors."""

    def __init__(self, recognizer: SpeechRecognizer):
        super().__init__()
        self.mel = recognizer.workload.fbank._mel
        self.model = recognizer.model
        self.floor = FLOOR

    @torch.jit.export
    def resample(self, waveform: Tensor, rate: int) -> Tensor:
        return torchaudio.functional.resample(waveform, rate, 16000)

    @torch.jit.export
    def features(self, waveform: Tensor) -> Tensor:
        return normalized(torch.log(self.mel(waveform.float()) + self.floor).transpose(0, 1))

    def forward(self, feats: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        return self.model(feats, lengths)


def export(state: dict, out: Path) -> dict:
    """Write `state`'s model (a checkpoint's) as an export into the folder `out` (made; files in it
    replaced); returns a summary: the folder, its files, the units and what decoding it offers."""
    recognizer = SpeechRecognizer.from_checkpoint(state, warps=False, device="cpu")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("lexicon.txt", "lm.arpa"):  # an earlier export's, which this checkpoint may not replace
        (out / name).unlink(missing_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script's notice of its deprecation
        torch.jit.script(ExportedModel(recognizer).eval()).save(str(out / "model.pt"))
    tokenizer, decoding = recognizer.workload.tokenizer, recognizer.workload.config.decoding
    (out / "tokens.txt").write_text("".join(f"{name}\n" for name in tokenizer.unit_names()), encoding="utf-8")
    offers = ["greedy"]
    if "lexicon" in state:
        words = sorted(set(state["lexicon"]) - {UNK})  # as `jobs.decode.LexiconDecoder` writes its lexicon
        (out / "lexicon.txt").write_text("".join(f"{w} {' '.join(tokenizer.spell(w))}\n" for w in words),
                                         encoding="utf-8")
        offers.append("lexicon")
    if "lm_arpa" in state:
        (out / "lm.arpa").write_text(state["lm_arpa"], encoding="utf-8")
    config = {"sample_rate": SAMPLE_RATE, "max_batch_seconds": recognizer.max_batch_seconds,
              "space": "\u2581" if isinstance(tokenizer, BpeTokenizer) else tokenizer.word_separator,
              "word_separator": tokenizer.word_separator, "decoding": decoding.kind,
              "search": {"beam": decoding.beam, "beam_tokens": decoding.beam_tokens,
                         "beam_threshold": decoding.beam_threshold, "word_score": decoding.word_score},
              "warps_not_applied": decoding.warps, "model": state["spec"].get("model", {}).get("kind")}
    (out / "config.json").write_text(json.dumps(config, indent=2, allow_nan=False) + "\n")
    shutil.copyfile(SCRIPT, out / "transcribe.py")
    return {"out": str(out), "files": sorted(p.name for p in out.iterdir()), "units": len(tokenizer.unit_names()),
            "decoding": offers, "bytes": sum(p.stat().st_size for p in out.iterdir())}
