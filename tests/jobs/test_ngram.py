"""The word n-gram language model (jobs/ngram.py) and the beam search that uses it (jobs/decode.py):
Kneser-Ney probabilities that sum to one after any history, an ARPA file that reads back the
same model, a malformed one (or a file that is none) refused in one line naming the file and
line, and a language model that turns an acoustically likelier misspelling into the word its text
makes likely."""

import math

import pytest
import torch

from jobs.data.manifests import DataError
from jobs.decode import LexiconDecoder, greedy_decode
from jobs.ngram import EOS, UNK, ArpaError, NgramModel, estimate
from jobs.tokenizer import BLANK, CharTokenizer

pytestmark = pytest.mark.unit

TEXT = ["the cat sat on the mat", "the dog sat on the mat", "a cat sat on a hat", "the mat is red"]


def _model(order: int = 3) -> NgramModel:
    return estimate([line.split() for line in TEXT], order=order)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_probabilities_after_any_history_sum_to_one(order):
    lm = _model(order)
    words = [w for w in lm.vocabulary if w != "<s>"]
    assert {UNK, EOS, "cat", "mat"} <= set(words)
    for history in [("<s>",), ("<s>", "the"), ("on", "the"), ("sat", "on"), ("never", "seen"), ()]:
        total = sum(10 ** lm.logprob(history, w) for w in words)
        assert total == pytest.approx(1.0, abs=1e-6), history
    if order == 3:  # seen context raises what followed it: "the" after "on"
        assert lm.logprob(("sat", "on"), "the") > lm.logprob(("sat", "on"), "cat")


def test_an_arpa_file_reads_back_the_same_model_and_a_malformed_one_is_refused_by_line(tmp_path):
    lm = _model()
    lm.write_arpa(tmp_path / "lm.arpa")
    again = NgramModel.read_arpa(tmp_path / "lm.arpa")
    for history, word in [(("<s>",), "the"), (("on", "the"), "mat"), (("a",), "dog"), (("x", "y"), "zebra")]:
        assert again.logprob(history, word) == pytest.approx(lm.logprob(history, word), abs=1e-5)
    text = (tmp_path / "lm.arpa").read_text().splitlines()
    bad_line = next(i for i, line in enumerate(text) if line.startswith("\\2-grams:")) + 1
    text[bad_line] = "-0.5"
    (tmp_path / "bad.arpa").write_text("\n".join(text))
    with pytest.raises(ValueError, match=rf"bad.arpa:{bad_line + 1}: not an ARPA 2-gram line"):
        NgramModel.read_arpa(tmp_path / "bad.arpa")


@pytest.mark.parametrize("line, section", [
    ("ngram =12", "\\data\\"),  # a header line without its order: was an IndexError where readers catch ValueError
    ("ngram 1", "\\data\\"), ("ngram 2=x", "\\data\\"), ("\\x-grams:", "\\data\\"),
    ("-0.5\tthe\tnan", "\\1-grams:"), ("nan\tthe", "\\1-grams:"), ("-inf\tthe\t0.0", "\\1-grams:"),
    ("-0.5\tthe", "\\2-grams:"),
])
def test_a_file_that_is_not_arpa_is_one_line_naming_it_and_the_line(tmp_path, line, section):
    lines = _arpa_lines()
    at = lines.index(section) + 1
    lines.insert(at, line)
    (tmp_path / "bad.arpa").write_text("\n".join(lines))
    with pytest.raises(ArpaError) as caught:
        NgramModel.read_arpa(tmp_path / "bad.arpa")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'bad.arpa'}:{at + 1}: not an ARPA ") and message.endswith(f"{line!r}")
    assert "\n" not in message


def test_a_binary_file_or_a_model_without_unk_is_one_line_and_a_decoders_check_says_where(tmp_path):
    (tmp_path / "binary.arpa").write_bytes(b"\xff\xfe\x00 not text")
    with pytest.raises(ArpaError, match=rf"^{tmp_path / 'binary.arpa'}: cannot be read as an ARPA file \('utf-8' "):
        NgramModel.read_arpa(tmp_path / "binary.arpa")
    (tmp_path / "no-unk.arpa").write_text("\n".join(line for line in _arpa_lines() if "<unk>" not in line))
    with pytest.raises(ArpaError, match=rf"^{tmp_path / 'no-unk.arpa'}: the model has no <unk> unigram$"):
        NgramModel.read_arpa(tmp_path / "no-unk.arpa")
    from jobs.decode import DecodingAssets
    from jobs.sections import DecodingConfig

    assets = DecodingAssets(DecodingConfig(kind="lm", lm=str(tmp_path / "binary.arpa")), words=lambda: ["go"])
    with pytest.raises(DataError, match=rf"^decoding.lm: {tmp_path / 'binary.arpa'}: cannot be read"):
        assets.check()


def _arpa_lines() -> list[str]:
    lm = _model(order=2)
    return ["", "\\data\\", *[f"ngram {n}={sum(len(g) == n for g in lm.probs)}" for n in (1, 2)]] + [
        line for n in (1, 2) for line in ["", f"\\{n}-grams:"] + [
            f"{lm.probs[g]:.6f}\t{' '.join(g)}" for g in sorted(lm.probs) if len(g) == n]] + ["", "\\end\\"]


SPOKEN = "the cat sat on the mad"  # the last sound heard as "d" (-0.2) rather than "t" (-1.8)
WORDS = ["the", "cat", "sat", "on", "mat", "mad", "hat", "dog", "a"]


def _heard_mad(tok: CharTokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """CTC log-probabilities (1, frames, units) and lengths of SPOKEN, its final "d" with "t"
    second likeliest: two frames a unit, then a blank."""
    units = tok.encode(SPOKEN).tolist()
    frames = torch.tensor([f for unit in units for f in (unit, unit, BLANK)])
    log_probs = torch.full((1, len(frames), tok.vocab_size), -9.0)
    log_probs[..., BLANK] = -3.0
    log_probs[0, torch.arange(len(frames)), frames] = -0.05
    last = len(frames) - 3  # the two frames of the final "d"
    log_probs[0, last:last + 2, tok.encode("t")[0]] = -1.8
    log_probs[0, last:last + 2, tok.encode("d")[0]] = -0.2
    return log_probs.log_softmax(-1), torch.tensor([len(frames)])


def test_the_language_model_turns_an_acoustically_likelier_misspelling_into_the_right_word():
    tok = CharTokenizer()
    log_probs, lengths = _heard_mad(tok)
    assert greedy_decode(log_probs, lengths, tok) == [SPOKEN]
    assert LexiconDecoder(tok, WORDS)(log_probs, lengths) == [SPOKEN]  # both are words: the lexicon cannot tell
    assert LexiconDecoder(tok, WORDS, lm=_model(), lm_weight=1.0)(log_probs, lengths) == ["the cat sat on the mat"]
    assert math.isfinite(_model().logprob(("the",), "mad"))  # "mad" is unknown to the text: <unk>, not -inf


def test_beam_tokens_bounds_the_units_a_hypothesis_grows_by_per_frame():
    tok = CharTokenizer()
    log_probs, lengths = _heard_mad(tok)

    def decoded(beam_tokens: int) -> list[str]:
        return LexiconDecoder(tok, WORDS, lm=_model(), lm_weight=1.0, beam_tokens=beam_tokens)(log_probs, lengths)

    assert decoded(2) == ["the cat sat on the mat"]  # "t" is among the 2 units tried: the LM's word wins
    assert decoded(1) == [SPOKEN]  # only the likeliest unit: the LM never sees "mat"


def test_chorus_lm_models_a_manifests_transcripts_and_decoding_kind_lm_uses_it(corpus, tmp_path):
    from click.testing import CliRunner

    from jobs.data.manifests import read_corpus
    from jobs.sections import WorkloadConfig
    from jobs.tokenizer import normalize
    from jobs.workload import AsrWorkload
    from orchestrator.cli import main

    made = CliRunner().invoke(main, ["lm", str(corpus / "train.jsonl"), "--out", str(tmp_path / "lm.arpa")])
    assert made.exit_code == 0, made.output
    lm = NgramModel.read_arpa(tmp_path / "lm.arpa")
    words = {w for u in read_corpus(corpus / "train.jsonl")[0] for w in normalize(u.text).split()}
    assert set(lm.vocabulary) == words | {"<s>", "</s>", UNK} and lm.order == 3
    w = AsrWorkload(WorkloadConfig(data={"train": corpus / "train.jsonl"}, decoding={
        "kind": "lm", "lm": str(tmp_path / "lm.arpa"), "lm_weight": 0.5, "beam": 8}), seed=0)
    model = w.build_model()
    log_probs, lengths = model(torch.randn(2, 150, 80), torch.tensor([150, 100]))
    assert all(set(text.split()) <= words for text in w.decode(log_probs, lengths))
    assert "lexicon" in w.state_dict(model)  # its words travel with checkpoints, as the lexicon decoder's do


def test_a_missing_text_or_model_and_an_lm_decoder_without_one_are_one_line_errors(tmp_path):
    from click.testing import CliRunner
    from pydantic import ValidationError

    from jobs.sections import DecodingConfig
    from orchestrator.cli import main

    missing = CliRunner().invoke(main, ["lm", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "lm.arpa")])
    assert missing.exit_code == 1
    assert missing.output.strip() == f"Error: {tmp_path / 'nope.txt'}: no such text file or manifest"
    with pytest.raises(ValueError, match="no such ARPA file"):
        NgramModel.read_arpa(tmp_path / "lm.arpa")
    with pytest.raises(ValidationError, match="decoding.kind is lm but decoding.lm names no ARPA file"):
        DecodingConfig(kind="lm")


def test_a_checkpoint_carries_its_language_model_and_decodes_where_the_file_is_not(corpus, tmp_path):
    from jobs.sections import WorkloadConfig
    from jobs.workload import AsrWorkload

    estimate([["go", "left"], ["go", "right"]]).write_arpa(tmp_path / "lm.arpa")
    config = WorkloadConfig(data={"train": corpus / "train.jsonl"},
                            decoding={"kind": "lm", "lm": str(tmp_path / "lm.arpa")})
    trained = AsrWorkload(config, seed=0)
    model = trained.build_model()
    state = trained.state_dict(model)
    assert NgramModel.parse_arpa(state["lm_arpa"], "checkpoint").logprob(("go",), "left") == \
        pytest.approx(NgramModel.read_arpa(tmp_path / "lm.arpa").logprob(("go",), "left"))
    (tmp_path / "lm.arpa").unlink()  # the reader's machine has no such file: the checkpoint's copy decodes
    reader = AsrWorkload(config, seed=0)
    reader.load_state_dict(state, reader.build_model())
    log_probs, lengths = model(torch.randn(1, 120, 80), torch.tensor([120]))
    assert reader.decode(log_probs, lengths) == trained.decode(log_probs, lengths)
    from jobs.data.manifests import DataError

    with pytest.raises(DataError, match=r"^decoding.lm: .*lm.arpa: no such ARPA file"):  # a job stops before it starts
        AsrWorkload(config, seed=0).check_data()
