"""A growing Bloom filter: "certainly never seen" or "maybe seen", in about 1.2 bytes a key.

The daemon answers a retried Idempotency-Key for as long as the log lives (decisions D4),
also after the task left memory for the history table. Looking every new key up in that
table (no index: DuckDB keeps indexes in memory) would cost each submission a scan of the
whole history; the filter says, in memory, which keys can be there at all, so a fresh
submission (nearly all of them) reads nothing. A false "maybe" (about 1 %) only costs that
one lookup. It grows by adding a filter four times larger when the last is full, so a small
site pays ~120 KB and ten million keys ~15 MB. Pure data: it pickles with the snapshot.
"""

from __future__ import annotations

import hashlib

HASHES = 7
"""Bits set per key: the optimum for 1 % false positives at the planned load."""
BITS_PER_KEY = 10
FIRST = 100_000
"""Keys the first filter holds before the next one is added."""


class KeyFilter:
    def __init__(self) -> None:
        self._filters: list[tuple[bytearray, int, int]] = []
        """(bits, number of bits, capacity in keys), oldest first."""
        self._count = 0
        """Keys in the last filter."""

    def __len__(self) -> int:
        return sum(cap for _, _, cap in self._filters[:-1]) + self._count

    @staticmethod
    def _hashes(key: str) -> tuple[int, int]:
        d = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little") | 1

    def add(self, key: str) -> None:
        if not self._filters or self._count >= self._filters[-1][2]:
            cap = FIRST * 4 ** len(self._filters)
            self._filters.append((bytearray(cap * BITS_PER_KEY // 8 + 1), cap * BITS_PER_KEY, cap))
            self._count = 0
        bits, m, _ = self._filters[-1]
        h1, h2 = self._hashes(key)
        for i in range(HASHES):
            n = (h1 + i * h2) % m
            bits[n >> 3] |= 1 << (n & 7)
        self._count += 1

    def __contains__(self, key: str) -> bool:
        if not self._filters:
            return False
        h1, h2 = self._hashes(key)
        for bits, m, _ in self._filters:
            for i in range(HASHES):
                n = (h1 + i * h2) % m
                if not bits[n >> 3] & (1 << (n & 7)):
                    break
            else:
                return True
        return False
