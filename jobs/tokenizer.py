"""Character tokenizer for CTC: lower-case letters, apostrophe and space, with blank at index 0."""

from __future__ import annotations

import torch

BLANK = 0
ALPHABET = " 'abcdefghijklmnopqrstuvwxyz"


class CharTokenizer:
    """Maps text to character ids and back; id 0 is the CTC blank.

    Text is lower-cased; characters outside the alphabet are dropped, and runs of spaces fold
    to one, so LibriSpeech's upper-case transcripts and NeMo's lower-case ones encode alike.

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

    @staticmethod
    def normalize(text: str) -> str:
        return " ".join(text.lower().split())

    def encode(self, text: str) -> torch.Tensor:
        ids = [self._index[ch] for ch in self.normalize(text) if ch in self._index]
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids) -> str:
        chars = [self.alphabet[i - 1] for i in (int(i) for i in ids) if 0 < i <= len(self.alphabet)]
        return " ".join("".join(chars).split())
