"""Fewer bytes on the wire (`group.compression`): codecs that turn a flat float32 tensor into a
payload of bytes and back, and the error feedback that keeps what a codec drops from being lost.

- `none`: float32 as is (4 bytes a value).
- `bf16`: bfloat16 (2 bytes a value): float32's exponent, 8 bits of mantissa.
- `int8`: 1 byte a value in blocks of `INT8_BLOCK` values, each with its float32 scale (its largest
  magnitude / 127): 1.004 bytes a value.

A lossy codec is only ever applied with error feedback, so nothing it rounds away is lost, only
delayed (as 1-bit SGD, PowerSGD and INTELLECT-1's int8 all-reduce keep their residuals):
- a gradient sum (`Residual`): each step sends `Q(g + e)` and keeps `e = g + e - Q(g + e)`;
- a gossip link (`links.py`): each side keeps the *public copy* of both sides' weights, `x̂`,
  which both ends know bit for bit; an exchange sends `Q(x - x̂)` and both add it to `x̂` (the
  difference still unsent is the next exchange's), and the pairwise average moves each side by
  `(x̂_other - x̂_self) / 2`, so the two moves cancel and the sum of the models is kept exactly
  (CHOCO-Gossip, Koloskova et al., ICML 2019, with step 1/2).

Example:
    >>> import torch
    >>> codec = codec_for("int8")
    >>> x = torch.linspace(-1, 1, 5000)
    >>> payload = codec.encode(x)
    >>> payload.numel(), codec.payload_bytes(5000)
    (5012, 5012)
    >>> float((codec.decode(payload, 5000) - x).abs().max()) <= 1 / 254 + 1e-6
    True
"""

from __future__ import annotations

import torch

INT8_BLOCK = 2048  # values per int8 scale: 0.2% of the payload for scales
CODECS = ("none", "bf16", "int8")


class Float32:
    """No compression: the float32 bytes themselves."""

    name, lossy = "none", False

    def payload_bytes(self, n: int) -> int:
        return 4 * n

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        return values.detach().to("cpu", torch.float32).contiguous().view(torch.uint8)

    def decode(self, payload: torch.Tensor, n: int) -> torch.Tensor:
        return payload.view(torch.float32)[:n]

    def decode_add(self, payload: torch.Tensor, n: int, out: torch.Tensor, alpha: float = 1.0) -> None:
        out.add_(self.decode(payload, n), alpha=alpha)


class BFloat16:
    """Half the bytes: values rounded to bfloat16."""

    name, lossy = "bf16", True

    def payload_bytes(self, n: int) -> int:
        return 2 * n

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        return values.detach().to("cpu", torch.bfloat16).contiguous().view(torch.uint8)

    def decode(self, payload: torch.Tensor, n: int) -> torch.Tensor:
        return payload.view(torch.bfloat16)[:n].float()

    def decode_add(self, payload: torch.Tensor, n: int, out: torch.Tensor, alpha: float = 1.0) -> None:
        out.add_(payload.view(torch.bfloat16)[:n], alpha=alpha)


class Int8Blocks:
    """A quarter of the bytes: each block of INT8_BLOCK values as int8 times its own scale
    (scales first in the payload, so the int8 part needs no alignment).

    One float32 workspace of the padded length is kept between calls and every pass runs in
    place: a fresh 40 MB tensor costs more in page faults than the arithmetic on it (a
    10M-value encode took 145 ms allocating, one thread). So an instance serves one thread at a
    time: each link, each all-reduce member has its own."""

    name, lossy = "int8", True

    def __init__(self):
        self._work: torch.Tensor | None = None

    def payload_bytes(self, n: int) -> int:
        return 4 * _blocks(n) + n

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        n = values.numel()
        blocks = _blocks(n)
        work = self._workspace(n)
        work[:n].copy_(values.detach().reshape(-1))  # the padding stays 0
        rows = work.view(blocks, INT8_BLOCK)
        # the largest magnitude of each block / 127 (amax and amin: aminmax is 3x slower, abs() allocates)
        scales = torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg_()).div_(127.0)
        scales.clamp_min_(torch.finfo(torch.float32).tiny)
        payload = torch.empty(4 * blocks + n, dtype=torch.uint8)
        payload[:4 * blocks].view(torch.float32).copy_(scales)
        rows.div_(scales[:, None]).round_().clamp_(-127, 127)
        payload[4 * blocks:].view(torch.int8).copy_(work[:n])
        return payload

    def decode(self, payload: torch.Tensor, n: int) -> torch.Tensor:
        out = torch.zeros(n)
        self.decode_add(payload, n, out)
        return out

    def decode_add(self, payload: torch.Tensor, n: int, out: torch.Tensor, alpha: float = 1.0) -> None:
        """`out += alpha * decode(payload)`, without a full-length temporary."""
        blocks = _blocks(n)
        scales = payload[:4 * blocks].view(torch.float32)
        work = self._workspace(n)
        work[:n].copy_(payload[4 * blocks:4 * blocks + n].view(torch.int8))
        work.view(blocks, INT8_BLOCK).mul_(scales[:, None])
        out.add_(work[:n], alpha=alpha)

    def _workspace(self, n: int) -> torch.Tensor:
        size = _blocks(n) * INT8_BLOCK
        if self._work is None or self._work.numel() != size:
            self._work = torch.zeros(size)
        self._work[n:].zero_()
        return self._work


def _blocks(n: int) -> int:
    return max(1, -(-n // INT8_BLOCK))


def codec_for(name: str):
    """The codec `group.compression` names."""
    try:
        return {"none": Float32, "bf16": BFloat16, "int8": Int8Blocks}[name]()
    except KeyError:
        raise ValueError(f"unknown compression {name!r}; known: {', '.join(CODECS)}") from None


class Residual:
    """Error feedback for a sum of gradients: what the codec rounded away last time is added to
    what is sent next time."""

    def __init__(self, codec, n: int):
        self.codec, self.error = codec, torch.zeros(n) if codec.lossy else None

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        """The payload of `values` + the carried error; the error becomes what this payload drops."""
        if self.error is None:
            return self.codec.encode(values)
        wanted = self.error.add_(values.detach().reshape(-1).to("cpu", torch.float32))
        payload = self.codec.encode(wanted)
        self.codec.decode_add(payload, wanted.numel(), self.error, alpha=-1.0)  # error = wanted - decoded
        return payload
