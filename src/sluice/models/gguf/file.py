"""Read a GGUF file: its metadata as Python values and its tensors as views of the mapped file.

Why not the `gguf` package's GGUFReader: it builds a numpy view for every part of every metadata
value, about a million of them for a 49k-token vocabulary and its merges, which took 6-7 s of
the bundled model's start-up (in the gateway, which reads only the tokenizer, and again in the
worker). Here the metadata is parsed once with `struct` straight into the values
`ReaderField.contents()` returns (the same keys, types and values: tests/system/api/test_startup.py
compares the two on the bundled file), and each tensor is one `np.frombuffer` view over the
mapping, made when its `data` is read: nothing is copied and no weight byte is
reinterpreted, so what the loaders build from it is bit-identical to what they built from
GGUFReader.

The mapping is private copy-on-write (ACCESS_COPY), so the views are writable (torch.from_numpy
takes them without a warning) while the file itself is never written. The gateway reads
tokenizers with this and must not import torch, nor numpy (~15 MiB resident): the header is
parsed with `struct` alone, and numpy is imported only when a tensor's data is read.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

MAGIC = 0x46554747  # b"GGUF" read as a little-endian uint32
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32


class GgufFormatError(ValueError):
    """The file is not a GGUF file this reader understands (bad magic, version, truncated...)."""


class ValueType(IntEnum):
    """GGUF metadata value types (gguf.constants.GGUFValueType)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR_CODES = {
    ValueType.UINT8: "B",
    ValueType.INT8: "b",
    ValueType.UINT16: "H",
    ValueType.INT16: "h",
    ValueType.UINT32: "I",
    ValueType.INT32: "i",
    ValueType.FLOAT32: "f",
    ValueType.BOOL: "?",
    ValueType.UINT64: "Q",
    ValueType.INT64: "q",
    ValueType.FLOAT64: "d",
}

# The ggml tensor types sluice reads without the gguf package: id -> (name, values per block,
# bytes per block, numpy item type for unquantized types). Any other type is looked up in
# gguf.constants (imported only then: it costs ~0.3 s, and the loader needs gguf's dequantizer
# for such a type anyway).
_KNOWN_TYPES: dict[int, tuple[str, int, int, str | None]] = {
    0: ("F32", 1, 4, "f4"),
    1: ("F16", 1, 2, "f2"),
    3: ("Q4_1", 32, 20, None),
    8: ("Q8_0", 32, 34, None),
    30: ("BF16", 1, 2, None),
}
# unquantized types GGUFReader hands out as typed arrays (the rest as uint8 block bytes)
_TYPED = {"F16": "f2", "F32": "f4", "F64": "f8", "I8": "i1", "I16": "i2", "I32": "i4", "I64": "i8"}


def _type_info(type_id: int) -> tuple[str, int, int, str | None]:
    if type_id in _KNOWN_TYPES:
        return _KNOWN_TYPES[type_id]
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        raise GgufFormatError(f"unknown tensor type {type_id}") from None
    block, size = GGML_QUANT_SIZES[qtype]
    return qtype.name, block, size, _TYPED.get(qtype.name)


@dataclass(frozen=True, slots=True)
class GgufTensor:
    name: str
    type_id: int  # the ggml type id (gguf.constants.GGMLQuantizationType's value)
    type_name: str  # "Q4_1", "F32", ...
    dims: tuple[int, ...]  # ggml order: dims[0] is the innermost (columns)
    # where `data` lies: the mapping, the numpy item type ("<f4"; "u1" for block bytes), the
    # item count, the byte offset and the array's shape
    _buf: mmap.mmap
    _item: str
    _count: int
    _offset: int
    _data_shape: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy / torch order (rows first)."""
        return tuple(reversed(self.dims))

    @property
    def data(self) -> np.ndarray:
        """Float types: typed, shaped reversed(dims); quantized: uint8 [..., bytes per row]. A new
        view of the mapping each time (no copy)."""
        import numpy as np

        return np.frombuffer(self._buf, np.dtype(self._item), self._count, self._offset).reshape(self._data_shape)


@dataclass(frozen=True, slots=True)
class GgufFile:
    path: Path
    version: int
    metadata: dict[str, Any]  # key -> value, as GGUFReader's field.contents() gives it
    tensors: list[GgufTensor]

    def has_tensor(self, name: str) -> bool:
        return any(t.name == name for t in self.tensors)


class _Cursor:
    """Sequential reads from the mapping; any read past the end is a GgufFormatError."""

    def __init__(self, buf: mmap.mmap, order: str):
        self.buf = buf
        self.pos = 0
        self.order = order  # "<" or ">"
        self.size = len(buf)

    def need(self, n: int) -> None:
        if self.pos + n > self.size:
            raise GgufFormatError(f"the file ends inside its header (at byte {self.pos}; truncated?)")

    def scalar(self, code: str) -> Any:
        fmt = self.order + code
        n = struct.calcsize(fmt)
        self.need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def raw_string(self) -> bytes:
        n = self.scalar("Q")
        self.need(n)
        value = self.buf[self.pos : self.pos + n]
        self.pos += n
        return value

    def string(self) -> str:
        return self.raw_string().decode("utf-8")


class _Undecodable(Exception):
    """A metadata string that is not UTF-8: the field is left out (as GGUFReader's contents() fails)."""


def _value(cur: _Cursor, vtype: int) -> Any:
    if vtype == ValueType.STRING:
        try:
            return cur.string()
        except UnicodeDecodeError:
            raise _Undecodable from None
    if vtype == ValueType.ARRAY:
        return _array(cur)
    code = _SCALAR_CODES.get(vtype)  # type: ignore[call-overload]
    if code is None:
        raise GgufFormatError(f"unknown metadata value type {vtype}")
    return cur.scalar(code)


def _array(cur: _Cursor) -> list[Any]:
    item = cur.scalar("I")
    count = cur.scalar("Q")
    code = _SCALAR_CODES.get(item)
    if code is not None:  # numbers: one unpack (python ints/floats/bools, like contents())
        fmt = f"{cur.order}{count}{code}"
        size = struct.calcsize(fmt)
        cur.need(size)
        values = list(struct.unpack_from(fmt, cur.buf, cur.pos))
        cur.pos += size
        return values
    if item == ValueType.STRING:
        out = []
        bad = False
        for _ in range(count):  # keep reading after a bad string: the header must be parsed through
            raw = cur.raw_string()
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                bad = True
        if bad:
            raise _Undecodable
        return out
    if item == ValueType.ARRAY:  # nested arrays come out flattened, as GGUFReader flattens them
        flat: list[Any] = []
        for _ in range(count):
            flat += _array(cur)
        return flat
    raise GgufFormatError(f"unknown metadata array item type {item}")


def read_gguf(path: str | Path) -> GgufFile:
    """Parse the header and map the tensors. Raises GgufFormatError (or OSError) on a bad file."""
    path = Path(path)
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except ValueError:  # an empty file cannot be mapped
            raise GgufFormatError("the file is empty") from None
    cur = _Cursor(buf, "<")
    if cur.scalar("I") != MAGIC:
        raise GgufFormatError("bad magic (not a GGUF file)")
    version = cur.scalar("I")
    if version & 0xFFFF == 0:  # written on a machine of the other byte order
        cur.order = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in SUPPORTED_VERSIONS:
        raise GgufFormatError(f"unsupported GGUF version {version}")
    tensor_count = cur.scalar("Q")
    kv_count = cur.scalar("Q")
    # GGUFReader lists the header's counts as fields too
    metadata: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": tensor_count, "GGUF.kv_count": kv_count}
    seen: set[str] = set()
    alignment = DEFAULT_ALIGNMENT
    for _ in range(kv_count):
        key = cur.string()
        if key in seen:
            raise GgufFormatError(f"duplicate metadata key {key}")
        seen.add(key)
        vtype = cur.scalar("I")
        try:
            metadata[key] = _value(cur, vtype)
        except _Undecodable:
            continue
        if key == "general.alignment":
            if vtype != ValueType.UINT32 or metadata[key] <= 0 or metadata[key] & (metadata[key] - 1):
                raise GgufFormatError("general.alignment must be a uint32 power of two")
            alignment = metadata[key]
    infos = []
    for _ in range(tensor_count):
        name = cur.string()
        n_dims = cur.scalar("I")
        dims = tuple(cur.scalar("Q") for _ in range(n_dims))
        infos.append((name, dims, cur.scalar("I"), cur.scalar("Q")))
    data_start = -(-cur.pos // alignment) * alignment
    return GgufFile(path, version, metadata, _tensors(buf, infos, data_start, cur.order))


def _tensors(
    buf: mmap.mmap, infos: list[tuple[str, tuple[int, ...], int, int]], start: int, order: str
) -> list[GgufTensor]:
    tensors: list[GgufTensor] = []
    names: set[str] = set()
    for name, dims, type_id, offset in infos:
        if name in names:
            raise GgufFormatError(f"duplicate tensor {name}")
        names.add(name)
        type_name, block, block_bytes, item = _type_info(type_id)
        elements = math.prod(dims)
        shape = tuple(reversed(dims))
        if item is not None:
            dtype, itemsize = order + item, int(item[1:])
            count = elements
        else:  # block bytes, one row of blocks per row (GGUFReader's quant_shape_to_byte_shape)
            if shape[-1] % block:
                raise GgufFormatError(
                    f"tensor {name}: {shape[-1]} columns is not a multiple of {type_name}'s block {block}"
                )
            dtype, itemsize = "u1", 1
            count = elements // block * block_bytes
            shape = (*shape[:-1], shape[-1] // block * block_bytes)
        at = start + offset
        if at + count * itemsize > len(buf):
            raise GgufFormatError(f"tensor {name} extends past the end of the file (truncated?)")
        tensors.append(GgufTensor(name, type_id, type_name, dims, buf, dtype, count, at, shape))
    return tensors
