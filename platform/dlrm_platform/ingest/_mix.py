"""Stateless, vectorised pseudo-randomness keyed by integers (ids, line numbers).

Used where a value must depend only on a key, not on the order or batching in
which keys are visited: the hidden attributes of an id in the generator, the
train/eval assignment of a Criteo line, the row hash of the dedup converter.
"""

from __future__ import annotations

import zlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def salt(name: str, seed: int = 0) -> np.uint64:
    """A 64-bit salt naming one use of the hash, so different uses are independent."""
    return np.uint64((zlib.crc32(name.encode()) << 32 | (seed & 0xFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF)


def mix64(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finaliser (bit mixer) of a uint64 array, element-wise; wraps on overflow."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def splitmix64(keys: np.ndarray, salt_: np.uint64 | int = 0) -> np.ndarray:
    """SplitMix64 of ``keys`` (any integer array) xor ``salt_``; returns uint64, same shape."""
    with np.errstate(over="ignore"):
        return mix64((keys.astype(np.uint64, copy=False) ^ np.uint64(salt_)) + _GOLDEN)


def hash_uniform(keys: np.ndarray, salt_: np.uint64 | int = 0) -> np.ndarray:
    """float64 in [0, 1), a deterministic function of each key."""
    return (splitmix64(keys, salt_) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def hash_bucket(keys: np.ndarray, buckets: int, salt_: np.uint64 | int = 0) -> np.ndarray:
    """int64 in [0, buckets), a deterministic function of each key."""
    return (splitmix64(keys, salt_) % np.uint64(buckets)).astype(np.int64)


def hash_vectors(keys: np.ndarray, dim: int, salt_: np.uint64 | int = 0) -> np.ndarray:
    """float64 [len(keys), dim] of zero mean and unit variance, a deterministic function of each key.

    Uniform rather than normal coordinates: cheaper, and the generator needs
    only the first two moments.
    """
    k = keys.astype(np.uint64, copy=False).reshape(-1, 1) * np.uint64(dim) + np.arange(dim, dtype=np.uint64)
    return (hash_uniform(k, salt_) - 0.5) * np.sqrt(12.0)
