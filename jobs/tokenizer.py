"""Tokenizers for CTC, with blank at index 0: characters (lower-case letters, apostrophe and
space) or SentencePiece BPE subwords trained from the training transcripts. Both normalize text
alike (lower case, characters outside the alphabet dropped, runs of spaces folded), so
LibriSpeech's upper-case transcripts and NeMo's lower-case ones encode alike, and both save to a
small dict that a checkpoint carries (`state()`, `tokenizer_from_state`), so a checkpoint decodes
with the units it was trained on.
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import torch

from jobs.sections import TokenizerConfig

BLANK = 0
BLANK_NAME = "<blank>"  # the blank's name among `unit_names()`
WORD_SEPARATOR = "|"  # the space's name among a character tokenizer's `unit_names()`
ALPHABET = " 'abcdefghijklmnopqrstuvwxyz"


def normalize(text: str, alphabet: str = ALPHABET) -> str:
    """Lower case, characters outside `alphabet` dropped, runs of spaces folded to one."""
    return " ".join("".join(ch for ch in text.lower() if ch in alphabet or ch.isspace()).split())


class CharTokenizer:
    """Maps text to character ids and back; id 0 is the CTC blank.

    Example:
        >>> tok = CharTokenizer()
        >>> tok.decode(tok.encode("Go LEFT"))
        'go left'
    """

    def __init__(self, alphabet: str = ALPHABET):
        self.alphabet = alphabet
        self._index = {ch: i + 1 for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + 1

    def normalize(self, text: str) -> str:
        return normalize(text, self.alphabet)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self._index[ch] for ch in self.normalize(text)], dtype=torch.long)

    def decode(self, ids) -> str:
        chars = [self.alphabet[i - 1] for i in (int(i) for i in ids) if 0 < i <= len(self.alphabet)]
        return " ".join("".join(chars).split())

    def unit_names(self) -> list[str]:
        """Each output class's name, blank first, the space as `WORD_SEPARATOR` (a lexicon's units)."""
        return [BLANK_NAME] + [WORD_SEPARATOR if ch == " " else ch for ch in self.alphabet]

    def spell(self, word: str) -> list[str]:
        return list(word)

    word_separator = WORD_SEPARATOR

    def state(self) -> dict:
        return {"kind": "char", "alphabet": self.alphabet}


class BpeTokenizer:
    """SentencePiece BPE over normalized text: piece p is id p + 1 (0 is CTC's blank; piece 0 is
    `<unk>`). `vocab_size` is the model's output size, `vocab + 1`, whatever number of pieces the
    corpus gave (fewer than `vocab` when it has fewer distinct ones).

    Example:
        >>> tok = BpeTokenizer.train(["go left", "go right", "stop"] * 20, vocab=16)
        >>> tok.decode(tok.encode("GO left"))
        'go left'
    """

    def __init__(self, model: bytes, vocab: int):
        import sentencepiece

        self.model, self.vocab = model, vocab
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=model)
        if self._sp.get_piece_size() > vocab:
            raise ValueError(f"a BPE model of {self._sp.get_piece_size()} pieces does not fit model.tokenizer.vocab "
                             f"= {vocab}")

    @classmethod
    def train(cls, texts: Iterable[str], vocab: int) -> BpeTokenizer:
        """A BPE model of at most `vocab` pieces learnt from `texts` (normalized first); the same
        texts in the same order give the same bytes, so every learner trains the same one."""
        import sentencepiece

        lines = [line for line in (normalize(t) for t in texts) if line]
        if not lines:
            raise ValueError("no transcripts to train a BPE tokenizer from")
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=vocab,
            hard_vocab_limit=False, character_coverage=1.0, normalization_rule_name="identity",
            num_threads=1, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, minloglevel=2)
        return cls(model.getvalue(), vocab)

    @property
    def vocab_size(self) -> int:
        return self.vocab + 1

    @staticmethod
    def normalize(text: str) -> str:
        return normalize(text)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([i + 1 for i in self._sp.encode(self.normalize(text))], dtype=torch.long)

    def decode(self, ids) -> str:
        pieces = [int(i) - 1 for i in ids if 0 < int(i) <= self._sp.get_piece_size()]
        return " ".join(self._sp.decode(pieces).split())

    def unit_names(self) -> list[str]:
        """Each output class's name, blank first (classes beyond the learnt pieces: `<unused-k>`)."""
        pieces = [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]
        return [BLANK_NAME] + pieces + [f"<unused-{k}>" for k in range(self.vocab - len(pieces))]

    def spell(self, word: str) -> list[str]:
        return self._sp.encode_as_pieces(word)

    word_separator = BLANK_NAME  # a piece's "▁" starts a word; between words there is only blank

    def state(self) -> dict:
        return {"kind": "bpe", "vocab": self.vocab, "model": self.model}


def output_size(config: TokenizerConfig) -> int:
    """The model's output classes for `config`'s tokenizer, known before any tokenizer is trained."""
    return {"char": CharTokenizer().vocab_size, "bpe": config.vocab + 1}[config.kind]


def build_tokenizer(config: TokenizerConfig, transcripts: Iterable[str]) -> CharTokenizer | BpeTokenizer:
    """`config`'s tokenizer; BPE learns from `transcripts` (read only for BPE)."""
    makers = {"char": CharTokenizer, "bpe": lambda: BpeTokenizer.train(transcripts, config.vocab)}
    return makers[config.kind]()


def tokenizer_from_state(state: dict) -> CharTokenizer | BpeTokenizer:
    """The tokenizer a checkpoint saved (`state()`)."""
    if state["kind"] == "char":
        return CharTokenizer(state["alphabet"])
    return BpeTokenizer(state["model"], state["vocab"])
