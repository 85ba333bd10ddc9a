"""CTC decoding: greedy (best class per frame, repeats collapsed, blanks dropped), or a beam search
constrained to a lexicon (flashlight's, through torchaudio's `ctc_decoder`), in which every
hypothesis is a sequence of known words spelled in the model's units, optionally scored by a word
n-gram language model (`jobs/ngram.py`) as well."""

from __future__ import annotations

import functools
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torchaudio.models.decoder import CTCDecoderLM, CTCDecoderLMState

from jobs.data.manifests import DataError
from jobs.ngram import BOS, EOS, UNK, NgramModel, read_arpa_text
from jobs.sections import DecodingConfig
from jobs.tokenizer import BLANK, BLANK_NAME, BpeTokenizer, CharTokenizer

Decoder = Callable[[torch.Tensor, torch.Tensor], list[str]]  # (log_probs, lengths) -> one text per utterance


def greedy_decode(log_probs: torch.Tensor, lengths: torch.Tensor, tokenizer: CharTokenizer | BpeTokenizer) -> list[str]:
    """Decode a batch of CTC outputs.

    Args:
        log_probs: (batch, frames, classes) log-probabilities.
        lengths: (batch,) valid frames per utterance.
        tokenizer: maps the surviving ids back to text.
    """
    best = log_probs.argmax(dim=-1).cpu()
    texts = []
    for row, n in zip(best, lengths.cpu().tolist(), strict=True):
        row = torch.unique_consecutive(row[:n])
        texts.append(tokenizer.decode(row[row != BLANK].tolist()))
    return texts


class LexiconDecoder:
    """Beam search over `words` (normalized, e.g. the training transcripts' words), each spelled by
    `tokenizer`; `beam` hypotheses kept per frame, `word_score` added per word.

    Example:
        >>> tok = CharTokenizer()
        >>> log_probs = torch.full((1, 3, tok.vocab_size), -9.0).index_fill_(2, torch.tensor([BLANK]), -3.0)
        >>> for frame, unit in enumerate(tok.encode("gox")):
        ...     log_probs[0, frame, unit] = -0.1
        >>> frames = torch.tensor([3])
        >>> greedy_decode(log_probs, frames, tok), LexiconDecoder(tok, ["go", "no"])(log_probs, frames)
        (['gox'], ['go'])
    """

    def __init__(self, tokenizer: CharTokenizer | BpeTokenizer, words: list[str], beam: int = 10,
                 word_score: float = 0.0, lm: NgramModel | None = None, lm_weight: float = 1.0,
                 beam_tokens: int | None = None, beam_threshold: float = 50.0):
        from torchaudio.models.decoder import ctc_decoder  # flashlight-text underneath

        if not words:
            raise ValueError("a lexicon decoder needs at least one word")
        self.words = sorted(set(words) - {UNK})
        with tempfile.TemporaryDirectory() as folder:
            lexicon, names = Path(folder) / "lexicon.txt", Path(folder) / "words.txt"
            lexicon.write_text("".join(f"{w} {' '.join(tokenizer.spell(w))}\n" for w in self.words))
            names.write_text("".join(f"{w}\n" for w in [*self.words, UNK]))  # the decoder's word indices
            self._search = ctc_decoder(
                lexicon=str(lexicon), tokens=tokenizer.unit_names(),
                lm=NgramDecoderLM(lm, [*self.words, UNK]) if lm is not None else None,
                lm_dict=str(names) if lm is not None else None, lm_weight=lm_weight,
                beam_size=beam, beam_size_token=beam_tokens, beam_threshold=beam_threshold,
                word_score=word_score, blank_token=BLANK_NAME,
                sil_token=tokenizer.word_separator, unk_word=UNK)

    def __call__(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        """(batch, frames, classes) log-probabilities and (batch,) valid frames -> one text each."""
        best = self._search(log_probs.detach().float().cpu().contiguous(), lengths.cpu().to(torch.int32))
        return [" ".join(hyps[0].words) if hyps else "" for hyps in best]


class NgramDecoderLM(CTCDecoderLM):
    """An `NgramModel` as flashlight's beam search asks a language model: natural-log scores of a
    word (by its index in `words`) after a state's last words; a state per distinct history."""

    def __init__(self, model: NgramModel, words: list[str]):
        CTCDecoderLM.__init__(self)
        self.model, self.words = model, words
        self.history: dict[CTCDecoderLMState, tuple[str, ...]] = {}

    def start(self, start_with_nothing: bool) -> CTCDecoderLMState:
        state = CTCDecoderLMState()
        self.history = {state: (BOS,)}  # one utterance's states at a time
        self.scored: dict[tuple[CTCDecoderLMState, int], tuple[CTCDecoderLMState, float]] = {}
        return state

    def _next(self, state: CTCDecoderLMState, index: int, word: str) -> tuple[CTCDecoderLMState, float]:
        seen = self.history[state]
        child = state.child(index)
        self.history.setdefault(child, (*seen, word)[-max(1, self.model.order - 1):])
        return child, self.model.logprob(seen, word) * math.log(10)

    def score(self, state: CTCDecoderLMState, usr_token_idx: int) -> tuple[CTCDecoderLMState, float]:
        """The search asks the same (state, word) again and again, frame after frame (40 utterances:
        2.5 million asks): each is worked out once an utterance."""
        key = (state, usr_token_idx)
        found = self.scored.get(key)
        if found is None:
            found = self.scored[key] = self._next(state, usr_token_idx, self.words[usr_token_idx])
        return found

    def finish(self, state: CTCDecoderLMState) -> tuple[CTCDecoderLMState, float]:
        return self._next(state, -1, EOS)


class DecodingAssets:
    """What decoding needs besides the model, which checkpoints carry so that a reloaded model
    decodes as it did wherever it is read: the words of a lexicon (`lexicon`, `lm` decoding; else
    `words()`, e.g. the training transcripts') and the language model's ARPA text (`lm` decoding;
    else read from `decoding.lm`)."""

    def __init__(self, config: DecodingConfig, words: Callable[[], list[str]]):
        self.config, self._words = config, words
        self.words: list[str] | None = None
        self.arpa: str | None = None

    def lexicon(self) -> list[str]:
        if self.words is None:
            self.words = self._words()
        return self.words

    def lm(self) -> NgramModel:
        if self.arpa is None:
            self.arpa = read_arpa_text(self.config.lm)
        return NgramModel.parse_arpa(self.arpa, self.config.lm)

    def check(self) -> None:
        """A DataError when `lm` decoding's model is missing or malformed (before a job places anything)."""
        if self.config.kind in {"lm"}:
            try:
                self.lm()
            except ValueError as exc:
                raise DataError(f"decoding.lm: {exc}") from None

    def state(self) -> dict:
        carried = {"lexicon": self.lexicon()} if self.config.uses_lexicon else {}
        if self.config.kind in {"lm"}:
            self.lm()
            carried["lm_arpa"] = self.arpa
        return carried

    def load(self, state: dict) -> None:
        if "lexicon" in state:
            self.words = list(state["lexicon"])
        if "lm_arpa" in state:
            self.arpa = str(state["lm_arpa"])

    def decoder(self, tokenizer: CharTokenizer | BpeTokenizer) -> Decoder:
        """The spec's decoder over `tokenizer`'s units, with these words and language model."""
        c = self.config
        search = {"beam": c.beam, "word_score": c.word_score, "beam_tokens": c.beam_tokens,
                  "beam_threshold": c.beam_threshold}
        makers = {"greedy": lambda: functools.partial(greedy_decode, tokenizer=tokenizer),
                  "lexicon": lambda: LexiconDecoder(tokenizer, self.lexicon(), **search),
                  "lm": lambda: LexiconDecoder(tokenizer, self.lexicon(), lm=self.lm(), lm_weight=c.lm_weight,
                                               **search)}
        return makers[c.kind]()
