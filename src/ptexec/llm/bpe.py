"""Byte-pair merges of one pre-tokenized piece by rank, tiktoken's rule, in ``n log n``.

tiktoken's rule: the piece starts as its bytes; while some two neighbouring parts make a
token of the vocabulary, the pair whose token has the lowest rank is merged (the leftmost
of equal ones); each part left is its token. tiktoken and ``pytorch-tokenizers`` look for
that pair anew after each merge: ``n**2`` for a piece of ``n`` bytes, so a prompt of one
long word (100 KB of letters) took seconds and a megabyte minutes. Here every pair is
kept in a heap ordered by (rank, position), a merged-away pair is skipped when it comes
up, and the merges happen in the same order, so the tokens are the same.
"""

from __future__ import annotations

import base64
import binascii
import heapq
from collections.abc import Mapping
from pathlib import Path

from ..errors import TokenizerError

__all__ = ["LONG_PIECE", "merge", "read_ranks"]

LONG_PIECE = 256
"""Pieces of more bytes than this are merged here (shorter ones cost the library less)."""


def read_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken file's tokens (lines of ``<base64 bytes> <rank>``) by their bytes."""
    ranks: dict[bytes, int] = {}
    try:
        with open(path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
    except (OSError, ValueError, binascii.Error) as e:
        raise TokenizerError(f"{path}: not a tiktoken file ({e})") from None
    return ranks


def merge(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """The tokens of ``piece`` under tiktoken's rule (see the module docstring)."""
    n = len(piece)
    if n <= 1:
        return [ranks[piece]] if n else []
    end = list(range(1, n + 1))  # the part starting at i ends at end[i] (i: a part's start)
    before = list(range(-1, n - 1))  # the start of the part before it (-1: none)
    alive = [True] * n
    heap = [(r, i, i + 2) for i in range(n - 1) if (r := ranks.get(piece[i : i + 2])) is not None]
    heapq.heapify(heap)
    while heap:
        _, i, stop = heapq.heappop(heap)
        j = end[i] if alive[i] else n
        if j >= n or end[j] != stop:  # no longer the pair of two parts next to each other
            continue
        alive[j] = False
        end[i] = stop
        if stop < n:
            before[stop] = i
            r = ranks.get(piece[i : end[stop]])
            if r is not None:
                heapq.heappush(heap, (r, i, end[stop]))
        b = before[i]
        if b >= 0:
            r = ranks.get(piece[b:stop])
            if r is not None:
                heapq.heappush(heap, (r, b, stop))
    out = []
    i = 0
    while i < n:
        token = ranks.get(piece[i : end[i]])
        if token is None:
            raise TokenizerError(f"byte {piece[i : end[i]]!r} has no token in the vocabulary")
        out.append(token)
        i = end[i]
    return out
