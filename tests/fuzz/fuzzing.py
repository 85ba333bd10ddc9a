"""What the fuzz tests share (`from tests.fuzz.fuzzing import ...`): their hypothesis settings, the
checks every input must pass, and bytes edited at random.

Settings (`fuzzed(n)`): in the unit tier `n` examples a test, drawn from a fixed seed
(`derandomize`: the same inputs on every run, so a red test is red again), no example database
(hypothesis's caches go to the temp folder, not the checkout).
With `CHORUS_FUZZ_EXAMPLES=N` (a nightly run) each test draws N examples from a fresh seed instead;
a failure prints how to reproduce it (`@reproduce_failure`), and the input it shrank to belongs in
the test as an `@example`.

Each input (`one_input`) must be parsed within PER_INPUT_S, and may fail only with the parser's own
error types, whose message is one line (naming the file, where the parser names one). A `Sandbox`
(`with Sandbox(tmp_path) as box:`, its `run` the parser's folder, the cwd an empty one) checks
that nothing was written outside that folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

EXAMPLES = "CHORUS_FUZZ_EXAMPLES"
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "chorus-hypothesis")  # its caches: not into the checkout
PER_INPUT_S = 2.0  # a parser's time on one small input, at most: ~100x what any takes here; more is a hang


def fuzzed(examples: int) -> settings:
    """Hypothesis settings for a fuzz test: `examples` from a fixed seed, or CHORUS_FUZZ_EXAMPLES from a fresh one."""
    nightly = int(os.environ.get(EXAMPLES) or 0)
    return settings(max_examples=nightly or examples, derandomize=not nightly, database=None, deadline=None,
                    print_blob=True, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                            HealthCheck.data_too_large, HealthCheck.large_base_example])


def check_message(exc: BaseException, starts: str = "", per_problem: bool = False) -> None:
    """A project error's message: one line (its type's contract) beginning with `starts`; or, with
    `per_problem` (a spec's errors: a line for each problem), lines that are each one line, the
    first beginning with `starts`."""
    message = str(exc)
    lines = message.split("\n") if per_problem else [message]
    assert all(line.strip() and line.isprintable() for line in lines), \
        f"{type(exc).__name__} not of {'lines that are each ' if per_problem else ''}one line: {message!r}"
    assert message.startswith(starts), f"{message!r} does not begin with {starts!r}"


class Outcome:
    """What `one_input` saw: the parser's own error, if it raised one."""
    error: BaseException | None = None


@contextmanager
def one_input(own: type[BaseException] | tuple[type[BaseException], ...], starts: str = "",
              per_problem: bool = False) -> Iterator[Outcome]:
    """The body is a parser's work on one input: any exception but `own` (whose message must be one
    line beginning with `starts`: `check_message`) propagates as the failure it is; it must end
    within PER_INPUT_S."""
    began, outcome = time.monotonic(), Outcome()
    try:
        yield outcome
    except own as exc:
        check_message(exc, starts, per_problem)
        outcome.error = exc
    took = time.monotonic() - began
    assert took < PER_INPUT_S, f"one input took {took:.2f} s (a hang?)"


class Sandbox:
    """A fresh folder in `parent` holding a run folder (`run`: where a parser is pointed), a file
    beside it that no parser may touch, and an empty working directory (`cwd`: the test's, while
    it parses) that must stay empty: `check()` asserts that nothing outside the run was written."""

    def __init__(self, parent: Path):
        self.root = Path(tempfile.mkdtemp(dir=parent))
        self.run, self.cwd, self.beside = self.root / "run", self.root / "cwd", self.root / "beside.txt"
        self.run.mkdir()
        self.cwd.mkdir()
        self.beside.write_text("not a parser's")

    def __enter__(self) -> Sandbox:
        self._was = os.getcwd()
        os.chdir(self.cwd)
        return self

    def __exit__(self, *exc) -> None:
        os.chdir(self._was)
        if exc[0] is None:
            self.check()
        shutil.rmtree(self.root, ignore_errors=True)

    def check(self) -> None:
        found = sorted(p.name for p in self.root.iterdir())
        assert found == ["beside.txt", "cwd", "run"], f"written outside the run: {found}"
        assert self.beside.read_text() == "not a parser's" and not any(self.cwd.iterdir()), \
            f"written outside the run: {list(self.cwd.iterdir())}"


def edited(base: bytes, max_edits: int = 4) -> st.SearchStrategy[bytes]:
    """`base` with up to `max_edits` random edits: bytes flipped, overwritten or inserted, or the rest cut off."""
    edit = st.tuples(st.sampled_from(["flip", "overwrite", "insert", "cut"]), st.integers(0, max(0, len(base) - 1)),
                     st.binary(min_size=1, max_size=16))
    return st.lists(edit, max_size=max_edits).map(lambda edits: _apply(base, edits))


def _apply(data: bytes, edits: list[tuple[str, int, bytes]]) -> bytes:
    out = bytearray(data)
    for kind, at, new in edits:
        at = min(at, len(out))
        if kind == "flip" and at < len(out):
            out[at] ^= new[0] or 0xFF
        elif kind == "overwrite":
            out[at:at + len(new)] = new
        elif kind == "insert":
            out[at:at] = new
        elif kind == "cut":
            del out[at:]
    return bytes(out)


JSON_SCALARS = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
