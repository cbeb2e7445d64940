"""Token selection: greedy, temperature, top-k, top-p, with reproducible per-request seeds.

Sampling uses the exponential race (argmax p_i / E_i with E_i ~ Exp(1) is a draw from p), with
the noise for output position i drawn from a generator seeded by mix(seed, i). So a request's
tokens depend only on its own logits, seed and position: not on batch neighbours, not on how
often it was preempted and recomputed.

Constrained rows (a grammar per row: JSON schema, tool calls) are masked first: forbidden
tokens get -inf, then the row samples as usual, so greedy picks the best allowed token and
seeded sampling draws from the renormalised allowed set. Rows without a grammar are not touched
(models/grammar/bitmask.py).
"""

from __future__ import annotations

import torch

from sluice.models.grammar.bitmask import RowGrammar, apply_grammars
from sluice.models.kernels import loaded_ops
from sluice.types import SamplingParams

_MASK64 = (1 << 64) - 1


def mix_seed(seed: int, position: int) -> int:
    """splitmix64 of (seed, position): decorrelated streams for neighbouring positions."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def _nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest set of most likely tokens whose mass reaches top_p (the token that crosses it
    included), most likely first, equal probabilities in token order; their probabilities and ids.

    Sorted among candidates only: every token below the cutoff (1 - top_p) / (2 V) has less
    probability than any candidate, and all V of them together less than (1 - top_p) / 2, so the
    candidates hold more than top_p and the nucleus lies among them. Candidates are typically a
    few hundred of the 49,152-token vocabulary (the bundled model at temperature 0.7-1.0, top_p
    0.8-0.95): a row's nucleus 150-220 us instead of 600 with the top 1,024 by topk (docs/
    BENCHMARKS.md, "Sampling at a temperature"). Should rounding leave the candidates' summed mass
    below top_p, the row sorts in full."""
    if probs.device.type != "cpu":
        return _nucleus_on_device(probs, top_p)
    idx = (probs >= (1.0 - top_p) / (2 * probs.shape[0])).nonzero().squeeze(1)  # ascending token ids
    p_sorted, order = probs[idx].sort(descending=True, stable=True)
    idx = idx[order]
    cum = p_sorted.cumsum(0)
    if idx.shape[0] < probs.shape[0] and (idx.shape[0] == 0 or cum[-1] < top_p):  # none: a row of NaN
        p_sorted, idx = probs.sort(descending=True, stable=True)
        cum = p_sorted.cumsum(0)
    keep = (cum - p_sorted) < top_p  # keeps the token that crosses top_p
    keep[0] = True
    return p_sorted[keep], idx[keep]


def _nucleus_on_device(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The same nucleus without reading anything back: the CPU path's candidate cap needs a
    look at the cumulative mass and its boolean indexing a look at the kept count, each a host
    sync on a GPU. A full sort is cheap there, and tokens outside the nucleus get probability 0,
    which the exponential race never picks (the top token is always kept)."""
    p_sorted, idx = probs.sort(descending=True)
    keep = (p_sorted.cumsum(0) - p_sorted) < top_p
    keep[0] = True
    return p_sorted * keep, idx


def _sample_row(logits: torch.Tensor, params: SamplingParams, seed: int, position: int) -> torch.Tensor:
    """The chosen token id as a 0-d tensor on the logits' device (nothing read back)."""
    row = logits.float() / params.temperature
    ids: torch.Tensor | None = None
    if 0 < params.top_k < row.shape[0]:
        row, ids = row.topk(params.top_k)
    probs = torch.softmax(row, dim=-1)
    if params.top_p < 1.0:
        probs, kept = _nucleus(probs, params.top_p)
        ids = kept if ids is None else ids[kept]
    # Noise from the device's own generator: a seed reproduces a draw on the same kind of
    # device (CPU and CUDA generators differ, so the same seed draws differently across them).
    gen = torch.Generator(device=probs.device).manual_seed(mix_seed(seed, position))
    # a draw of exactly 0 would make a 0-probability token's ratio 0/0 = NaN, which argmax picks
    noise = torch.empty_like(probs).exponential_(generator=gen).clamp_min_(torch.finfo(probs.dtype).tiny)
    choice = torch.argmax(probs / noise)
    return ids.gather(0, choice.view(1))[0] if ids is not None else choice


def sample_row(logits: torch.Tensor, params: SamplingParams, seed: int, position: int) -> int:
    return int(_sample_row(logits, params, seed, position))


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(dim=-1), through the CPU kernels' argmax where they are loaded (the same
    answer, ~10x less CPU: 1.5 -> ~0.1 ms for 32 rows of a 49,152-token vocabulary)."""
    ops = loaded_ops()
    if (
        ops is not None
        and logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.dim() == 2
        and logits.size(1) > 0
        and logits.stride(1) == 1
    ):
        return ops.argmax_rows(logits)
    return logits.argmax(dim=-1)


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    seeds: list[int],
    positions: list[int],
    grammars: list[RowGrammar | None] | None = None,
) -> list[int]:
    """One token per row of `logits` [N, vocab]; `grammars[i]` (if any) constrains row i.

    Every row's choice stays on the logits' device until one `.tolist()` at the end: on a GPU,
    the step's only read back (a constrained row's mask is written, never read)."""
    if grammars:
        rows = [i for i, g in enumerate(grammars) if g is not None]
        if rows:
            apply_grammars(logits, rows, [grammars[i] for i in rows])  # type: ignore[misc]
    greedy = argmax_rows(logits)
    if all(p.greedy for p in params):
        return greedy.tolist()
    chosen = [
        greedy[i] if p.greedy else _sample_row(logits[i], p, seeds[i], positions[i]) for i, p in enumerate(params)
    ]
    return torch.stack(chosen).tolist()
