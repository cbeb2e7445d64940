"""A dense vector on the wire, in the write log and in a Xapian value: float32, little-endian,
`DIM` of them; base64 (standard alphabet) where it travels as JSON text (1,368 characters)."""

from __future__ import annotations

import base64
import binascii

import numpy as np

DIM = 256  # wordllama's l2_supercat_256 (embedder.py)
VECTOR_BYTES = DIM * 4
_F32 = np.dtype("<f4")


def to_bytes(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype=_F32).tobytes()


def from_bytes(raw: bytes) -> np.ndarray:
    if len(raw) != VECTOR_BYTES:
        raise ValueError(f"a vector is {DIM} float32 values")
    vec = np.frombuffer(raw, dtype=_F32)
    if not np.isfinite(vec).all():
        raise ValueError("a vector's values are finite")
    return vec


def encode(vector: np.ndarray) -> str:
    return base64.b64encode(to_bytes(vector)).decode("ascii")


def decode(text: object) -> np.ndarray:
    """ValueError for anything but the base64 of DIM finite float32 values."""
    if not isinstance(text, str):
        raise ValueError("a vector is a base64 string")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeError):
        raise ValueError("a vector is a base64 string") from None
    return from_bytes(raw)
