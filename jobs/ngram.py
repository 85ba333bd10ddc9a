"""A word n-gram language model: estimated from text by interpolated Kneser-Ney (one absolute
discount, continuation counts for the lower orders), written and read as ARPA, scored with
back-off. What `decoding.kind: lm` adds to the lexicon beam search (`jobs/decode.py`).

In ARPA form an interpolated model is exact: a seen n-gram's entry holds its interpolated
probability, and a history's back-off weight is the mass its discounts freed (D x distinct
followers / count), which is what an unseen word gets times the lower order's probability.
KenLM's estimator (`lmplz`) does not install from the package index (its Python package only
queries models), hence this one; its ARPA files read in KenLM and any other ARPA reader.

Example:
    >>> lm = estimate([["go", "left"], ["go", "right"], ["stop"]], order=2)
    >>> lm.logprob(("<s>",), "go") > lm.logprob(("<s>",), "left")
    True
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
NEVER = -99.0  # log10 "probability" ARPA gives <s>, which is never predicted
MAX_ORDER = 100  # an n-gram order an ARPA file may have (KenLM builds up to 6 by default)


class ArpaError(ValueError):
    """A language model that cannot be read: the message is one line naming the file (and line)."""


class NgramModel:
    """log10 probabilities of the n-grams seen (`probs`) and back-off weights of the histories (`backoffs`)."""

    def __init__(self, order: int, probs: dict[tuple[str, ...], float], backoffs: dict[tuple[str, ...], float]):
        self.order, self.probs, self.backoffs = order, probs, backoffs

    @property
    def vocabulary(self) -> list[str]:
        return sorted(g[0] for g in self.probs if len(g) == 1)

    def logprob(self, history: tuple[str, ...], word: str) -> float:
        """log10 P(word | history), backing off to shorter histories; an unknown word is `<unk>`."""
        if (word,) not in self.probs:
            word = UNK
        history = tuple(w if (w,) in self.probs else UNK for w in history[len(history) - self.order + 1:])
        penalty = 0.0
        while (history + (word,)) not in self.probs:
            penalty += self.backoffs.get(history, 0.0)
            history = history[1:]
        return penalty + self.probs[history + (word,)]

    def write_arpa(self, path: str | Path) -> None:
        by_order = defaultdict(list)
        for gram in self.probs:
            by_order[len(gram)].append(gram)
        lines = ["", "\\data\\"] + [f"ngram {n}={len(by_order[n])}" for n in range(1, self.order + 1)]
        for n in range(1, self.order + 1):
            lines += ["", f"\\{n}-grams:"]
            for gram in sorted(by_order[n]):
                backoff = self.backoffs.get(gram)
                lines.append(f"{self.probs[gram]:.6f}\t{' '.join(gram)}" + (f"\t{backoff:.6f}" if backoff is not None
                                                                          and n < self.order else ""))
        Path(path).write_text("\n".join(lines + ["", "\\end\\", ""]))

    @classmethod
    def read_arpa(cls, path: str | Path) -> NgramModel:
        """A model from an ARPA file; a malformed one raises ArpaError naming the file and line."""
        return cls.parse_arpa(read_arpa_text(path), path)

    @classmethod
    def parse_arpa(cls, text: str, path: str | Path) -> NgramModel:
        """A model from ARPA text (read from `path`, which errors name); ArpaError when it is none."""
        probs, backoffs, order, n = {}, {}, 0, 0
        for line_no, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            try:
                if line.startswith("ngram "):  # "ngram N=count" in the \data\ header
                    order = max(order, _header_order(line))
                elif line.startswith("\\") and line.endswith("-grams:"):
                    n = _order(line[1:].partition("-")[0])
                elif line and line not in ("\\data\\", "\\end\\"):
                    _entry(line, n, probs, backoffs)
            except ValueError:
                what = f"{n}-gram" if n else "header"
                raise ArpaError(f"{path}:{line_no}: not an ARPA {what} line: {line[:80]!r}") from None
        if (UNK,) not in probs:
            raise ArpaError(f"{path}: the model has no {UNK} unigram")
        return cls(order, probs, backoffs)


def _header_order(line: str) -> int:
    """The order of a header's "ngram N=count" line; ValueError if it is not one."""
    head, equals, count = line.partition("=")
    if not equals or not (count.strip().isascii() and count.strip().isdigit()):
        raise ValueError(line)
    return _order(head.split()[-1])


def _order(field: str) -> int:
    """An n-gram order: a whole number in 1..MAX_ORDER; else ValueError."""
    if not (field.isascii() and field.isdigit()) or not 1 <= int(field) <= MAX_ORDER:
        raise ValueError(field)
    return int(field)


def _entry(line: str, n: int, probs: dict, backoffs: dict) -> None:
    """An n-gram line ("log10 P<tab>w1 ... wn[<tab>back-off]") into `probs` (and `backoffs`); ValueError if not one."""
    fields = line.split()
    if n == 0 or len(fields) not in (n + 1, n + 2):
        raise ValueError(line)
    values = [float(fields[0])] + ([float(fields[-1])] if len(fields) == n + 2 else [])
    if not all(math.isfinite(v) for v in values):
        raise ValueError(line)
    gram = tuple(fields[1:n + 1])
    probs[gram] = values[0]
    if len(values) == 2:
        backoffs[gram] = values[1]


def read_arpa_text(path: str | Path) -> str:
    if not Path(path).is_file():
        raise ArpaError(f"{path}: no such ARPA file (make one with `chorus lm TEXT --out {path}`)")
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ArpaError(f"{path}: cannot be read as an ARPA file ({str(exc).strip().splitlines()[0]})") from None


def estimate(sentences: Iterable[list[str]], order: int = 3, discount: float = 0.75) -> NgramModel:
    """An interpolated Kneser-Ney model of `sentences` (lists of words), with `<s>`, `</s>` and `<unk>`."""
    if order < 1 or not 0 < discount < 1:
        raise ValueError(f"order must be >= 1 and discount in (0, 1), got {order} and {discount}")
    counts = _adjusted_counts(sentences, order)
    if not counts[1]:
        raise ValueError("no words to estimate a language model from")
    vocabulary = {g[0] for g in counts[1]} | {UNK, EOS}
    probs: dict[tuple[str, ...], float] = {}
    backoffs: dict[tuple[str, ...], float] = {}
    lower: dict[tuple[str, ...], float] = {(w,): 1.0 / len(vocabulary) for w in vocabulary}  # order 0: uniform
    for n in range(1, order + 1):
        total, followers = Counter(), Counter()
        for gram, count in counts[n].items():
            total[gram[:-1]] += count
            followers[gram[:-1]] += 1
        freed = {h: discount * followers[h] / total[h] for h in total}
        level = {}
        grams = set(counts[n]) | ({(w,) for w in vocabulary} if n == 1 else set())
        for gram in grams:
            h = gram[:-1]
            below = lower[gram[1:]] if n > 1 else lower[gram]
            level[gram] = max(counts[n].get(gram, 0) - discount, 0) / total[h] + freed[h] * below
        for h, weight in freed.items():
            if n > 1:
                backoffs[h] = math.log10(weight)
        probs.update({g: math.log10(p) for g, p in level.items()})
        lower = level
    probs[(BOS,)] = NEVER
    backoffs.setdefault((BOS,), 0.0)
    return NgramModel(order, probs, backoffs)


def write_lm(text: str | Path, out: str | Path, order: int = 3) -> dict:
    """`chorus lm`: a model of TEXT's sentences written to `out` as ARPA. TEXT is a .jsonl manifest
    (its `text` fields) or a text file of one sentence a line, normalized as transcripts are."""
    from jobs.tokenizer import normalize

    text = Path(text)
    if not text.is_file():
        raise ValueError(f"{text}: no such text file or manifest")
    lines = text.read_text(errors="replace").splitlines()
    if text.suffix == ".jsonl":
        lines = [_transcript(line, f"{text}:{i}") for i, line in enumerate(lines, start=1) if line.strip()]
    sentences = [words for line in lines if (words := normalize(line).split())]
    model = estimate(sentences, order)
    model.write_arpa(out)
    grams = Counter(len(g) for g in model.probs)
    return {"out": str(out), "order": order, "sentences": len(sentences), "vocabulary": len(model.vocabulary),
            "ngrams": {n: grams[n] for n in sorted(grams)}}


def _transcript(line: str, where: str) -> str:
    """A manifest line's `text` ("" without one); ValueError naming `where` when the line is not a JSON object."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        row = None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: not a JSON object (a manifest line, with a text)")
    return row.get("text") if isinstance(row.get("text"), str) else ""


def _adjusted_counts(sentences: Iterable[list[str]], order: int) -> list[Counter]:
    """Per order, each n-gram's count: the raw count at the highest order and for n-grams that
    start a sentence, else its continuation count (the distinct words seen before it)."""
    raw = [Counter() for _ in range(order + 1)]
    before: list[defaultdict] = [defaultdict(set) for _ in range(order + 1)]
    for words in sentences:
        tokens = [BOS, *words, EOS]
        for n in range(1, order + 1):
            for i in range(len(tokens) - n + 1):
                gram = tuple(tokens[i:i + n])
                if gram == (BOS,):
                    continue
                raw[n][gram] += 1
                if i > 0:
                    before[n][gram].add(tokens[i - 1])
    counts = [Counter() for _ in range(order + 1)]
    for n in range(1, order + 1):
        for gram, count in raw[n].items():
            counts[n][gram] = count if n == order or gram[0] == BOS else len(before[n][gram])
    return counts
