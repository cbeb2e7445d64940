"""A weight kept in its GGUF blocks, as read from the file (no dequantization at load).

The loader hands these to the model instead of fp32 tensors when the CPU kernels run (they read
the blocks directly, see models/kernels); everything else calls `dequantize()`, which uses the
`gguf` package's reference code, the same that transformers uses, so the fp32 values agree bit
for bit. Rows are independent runs of blocks, so row permutations (llama.cpp's q/k order) and
concatenation (fused q/k/v, gate/up) work on the raw bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch


class QuantType(StrEnum):
    """The GGUF block types the kernels read; other types are dequantized at load."""

    Q4_1 = "Q4_1"  # 32 values: fp16 d, fp16 m, 16 bytes of nibbles; w = d*q + m
    Q8_0 = "Q8_0"  # 32 values: fp16 d, 32 int8; w = q*d


BLOCK_BYTES = {QuantType.Q4_1: 20, QuantType.Q8_0: 34}
BLOCK = 32


@dataclass(slots=True)
class QuantizedWeight:
    qtype: QuantType
    rows: int  # N (output features)
    cols: int  # K (input features), a multiple of 32
    data: np.ndarray  # uint8 [rows, cols / 32 * block bytes]

    @classmethod
    def from_blocks(cls, qtype: QuantType, rows: int, cols: int, raw: np.ndarray) -> QuantizedWeight:
        # A writable view is kept as it is (models/gguf/file.py maps the file copy-on-write, and
        # the kernels' packing copies the blocks anyway); a read-only one (gguf's GGUFReader) is
        # copied, so torch.from_numpy can take it.
        data = np.asarray(raw, dtype=np.uint8) if raw.flags.writeable else np.array(raw, dtype=np.uint8, copy=True)
        data = data.reshape(rows, cols // BLOCK * BLOCK_BYTES[qtype])
        return cls(qtype, rows, cols, data)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        array = dequantize(self.data.reshape(-1), GGMLQuantizationType[self.qtype.value])
        return torch.from_numpy(np.ascontiguousarray(array.reshape(self.rows, self.cols), dtype=np.float32)).to(dtype)

    @staticmethod
    def concat(parts: list[QuantizedWeight]) -> QuantizedWeight:
        first = parts[0]
        assert all(p.qtype == first.qtype and p.cols == first.cols for p in parts)
        data = np.concatenate([p.data for p in parts])
        return QuantizedWeight(first.qtype, int(data.shape[0]), first.cols, data)


Weight = torch.Tensor | QuantizedWeight


def as_tensor(w: Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return w.dequantize(dtype) if isinstance(w, QuantizedWeight) else w
