"""Fuzzing the ARPA reader (`jobs.ngram.NgramModel.read_arpa`: `decoding.lm`'s file, and the text a
checkpoint carries): valid models damaged line by line or byte by byte, and text or bytes that are
no model. Own error: `ArpaError` (a ValueError, as decoding's checks catch), one line beginning
with the file's name. A model that reads scores every word after any history with a finite number."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jobs.ngram import ArpaError, NgramModel, estimate
from tests.fuzz.fuzzing import Sandbox, edited, fuzzed, one_input

pytestmark = pytest.mark.unit

MODEL = estimate([s.split() for s in ["go left", "go right now", "stop", "left left"]], order=3)


def _arpa(lm: NgramModel) -> str:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        lm.write_arpa(Path(folder) / "lm.arpa")
        return (Path(folder) / "lm.arpa").read_text()


TEXT = _arpa(MODEL)
LINES = TEXT.splitlines()
ODD_LINES = st.sampled_from(["ngram =3", "ngram 1", "ngram x=1", "\\x-grams:", "\\0-grams:", "\\99999999999-grams:",
                             "nan\tgo", "-inf\tgo\t0", "1e999\tgo", "-1\t", "\\data\\", "\\end\\", ""]) \
    | st.text(max_size=30)


@st.composite
def arpa_texts(draw) -> bytes:
    lines = list(LINES)
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(lines)))
        if draw(st.booleans()) and at < len(lines):
            del lines[at]
        else:
            lines.insert(at, draw(ODD_LINES))
    text = "\n".join(lines).encode()
    return draw(st.just(text) | edited(text, 3))


@fuzzed(150)
@given(data=arpa_texts() | st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@example(data=TEXT.replace("ngram 1=", "ngram =").encode())  # was an IndexError where decoding catches ValueError
@example(data=b"\xff" + TEXT.encode())  # was a UnicodeDecodeError naming no file
@example(data=TEXT.replace("\\1-grams:\n", "\\1-grams:\nnan\tgo\n").encode())  # was a model scoring NaN
def test_an_arpa_file_reads_as_a_model_that_scores_or_is_refused_in_one_line(tmp_path, data):
    with Sandbox(tmp_path) as box, one_input(ArpaError, starts=f"{box.run / 'lm.arpa'}"):
        (box.run / "lm.arpa").write_bytes(data)
        lm = NgramModel.read_arpa(box.run / "lm.arpa")
        for history in [(), ("<s>",), ("go", "left"), ("never", "seen", "before")]:
            for word in ["go", "left", "</s>", "unseen"]:
                assert math.isfinite(lm.logprob(history, word))
