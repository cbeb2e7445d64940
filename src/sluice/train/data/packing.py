"""Pack tokenized examples into fixed-length rows: no padding wasted between examples.

Examples are concatenated in file order and cut every `seq_len` tokens (an example may span two
rows, as in pretraining-style packing); the last row is padded with the end-of-text token,
masked out of the loss. Attention is causal over the whole row, so a token may attend to the
end of the previous example in its row; the previous example ends with its end-of-turn / end-of-
text token, which is what the model sees between documents at serving time too.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from sluice.train.data.tokenize import Tokenized


def pack(examples: Iterable[Tokenized], seq_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32 [rows, seq_len], mask bool [rows, seq_len]); mask True = trained on."""
    ids: list[int] = []
    mask: list[bool] = []
    for ex in examples:
        ids.extend(ex.ids)
        mask.extend(ex.mask)
    rows = max(1, -(-len(ids) // seq_len))
    pad = rows * seq_len - len(ids)
    tokens = np.array(ids + [pad_id] * pad, dtype=np.int32).reshape(rows, seq_len)
    loss_mask = np.array(mask + [False] * pad, dtype=np.bool_).reshape(rows, seq_len)
    return tokens, loss_mask
