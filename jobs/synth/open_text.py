"""Sentences of real English for an open-vocabulary corpus (`chorus synth --task openvocab`): the
quotations of Debian's `fortunes` package, cut into sentences, normalized as ASR transcripts are
(numbers and symbols spelled out, case folded, punctuation dropped), and split so that no dev or
test sentence occurs in training and a chosen share of test words never occurs in training text.

Example:
    >>> spell_out("In 1984, 3 of 12 cats ate 2.5% more on the 21st.")
    'in nineteen eighty four three of twelve cats ate two point five percent more on the twenty first'
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORTUNES = Path("/usr/share/games/fortunes")
FORTUNES_PACKAGE = "fortunes"  # Debian's: the quotations (fortunes-min alone holds ~400)
MIN_WORDS, MAX_WORDS = 4, 20
# text that is not prose read aloud (code, chat logs, addresses, ASCII art) drops the sentence
NOT_PROSE = re.compile(r"[<>{}\[\]|\\/_*~^`#=@]|https?:|www\.|\.\.\.\.|[A-Z]{2,}:|^\s*[A-Z][a-z]*:")

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
SCALES = [(10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred")]
ORDINAL_ENDINGS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                   "nine": "ninth", "twelve": "twelfth"}


def cardinal(n: int) -> str:
    """`n` (0 to 999,999,999,999) in words: 1984 -> 'one thousand nine hundred eighty four'."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    for size, name in SCALES:
        if n >= size:
            rest = n % size
            return f"{cardinal(n // size)} {name}" + ("" if rest == 0 else " " + cardinal(rest))
    raise AssertionError(n)


def ordinal(n: int) -> str:
    """21 -> 'twenty first'."""
    words = cardinal(n).split()
    last = words[-1]
    words[-1] = ORDINAL_ENDINGS.get(last, last[:-1] + "ieth" if last.endswith("y") else last + "th")
    return " ".join(words)


def number(digits: str) -> str:
    """A number as read: a year-like 1100-1999 in pairs ('nineteen eighty four'), else a cardinal."""
    n = int(digits)
    if len(digits) == 4 and 1100 <= n <= 1999 and n % 100 != 0:
        return f"{cardinal(n // 100)} {cardinal(n % 100) if n % 100 >= 10 else 'oh ' + cardinal(n % 100)}"
    return cardinal(n)


_RULES = [  # (pattern, replacement) in order: money, percentages, ordinals, decimals, numbers, symbols
    (re.compile(r"(?<=\d),(?=\d{3}\b)"), ""),  # 1,000,000 -> 1000000
    (re.compile(r"\$(\d+)"), lambda m: f"{number(m[1])} dollars"),
    (re.compile(r"(\d+(?:\.\d+)?)\s?%"), lambda m: f"{m[1]} percent"),
    (re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.I), lambda m: ordinal(int(m[1]))),
    (re.compile(r"\b(\d+)\.(\d+)\b"), lambda m: f"{number(m[1])} point {' '.join(ONES[int(d)] for d in m[2])}"),
    (re.compile(r"\d{13,}"), ""),  # too long to be read as a number
    (re.compile(r"\d+"), lambda m: f" {number(m[0])} "),
    (re.compile(r"&"), " and "),
    (re.compile(r"\+"), " plus "),
]


def spell_out(sentence: str) -> str:
    """A sentence as a transcript: numbers and symbols in words, lower case, letters, apostrophes
    inside words and single spaces only."""
    text = unicodedata.normalize("NFKD", sentence).encode("ascii", "ignore").decode()
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    text = re.sub(r"[^a-z' ]+", " ", text.lower().replace("-", " "))
    words = [w.strip("'") for w in text.split()]
    return " ".join(w for w in words if w)


def sentences(folder: Path = FORTUNES) -> list[str]:
    """The distinct normalized sentences of MIN_WORDS to MAX_WORDS words in the quotations of
    every file of `folder` (fortune's format: quotations between lines of `%`), sorted."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no quotations (Debian: apt-get install {FORTUNES_PACKAGE})")
    found: set[str] = set()
    for path in sorted(folder.iterdir()):
        if path.suffix in {".dat", ".u8"} or not path.is_file() or path.name in {"art", "ascii-art"}:
            continue
        for quote in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            quote = re.sub(r"\s+", " ", re.sub(r"^\s*--.*$", "", quote, flags=re.M))  # not the attributions
            for raw in re.split(r"(?<=[.!?])\s+", quote):
                if NOT_PROSE.search(raw):
                    continue
                text = spell_out(raw)
                if MIN_WORDS <= len(text.split()) <= MAX_WORDS:
                    found.add(text)
    return sorted(found)


@dataclass(frozen=True)
class TextSplit:
    train: list[str]
    dev: list[str]
    test: list[str]
    held_out: frozenset[str]  # words chosen never to occur in training text

    def oov_rate(self, split: str = "test") -> float:
        """The share of `split`'s words (tokens) that never occur in training text."""
        known = {w for s in self.train for w in s.split()}
        words = [w for s in getattr(self, split) for w in s.split()]
        return sum(w not in known for w in words) / max(1, len(words))


def split_sentences(all_sentences: list[str], eval_sentences: int, seed: int, oov_share: float = 0.02) -> TextSplit:
    """Dev and test sentences (`eval_sentences` each) apart from training ones. Rare words of the
    test sentences (each in at most 3 sentences of all), drawn at random until they make up
    `oov_share` of the test's words, are held out: no training sentence holds one (those
    sentences are dropped), so at least that share of test words is out of the training
    vocabulary. Depends only on the sentences and the seed."""
    rng = np.random.default_rng(seed)
    order = [all_sentences[i] for i in rng.permutation(len(all_sentences))]
    dev, test, rest = order[:eval_sentences], order[eval_sentences:2 * eval_sentences], order[2 * eval_sentences:]
    in_sentences = Counter(w for s in all_sentences for w in set(s.split()))
    test_words = Counter(w for s in test for w in s.split())
    rare = [w for w in sorted(test_words) if in_sentences[w] <= 3]
    held, covered, total = set(), 0, sum(test_words.values())
    for i in rng.permutation(len(rare)).tolist():
        if covered >= oov_share * total:
            break
        held.add(rare[i])
        covered += test_words[rare[i]]
    train = [s for s in rest if not held.intersection(s.split())]
    return TextSplit(train, dev, test, frozenset(held))
