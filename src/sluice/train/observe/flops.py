"""Model FLOPs utilisation: the FLOPs a step needs by the 6·N·D rule, over what the hardware
could have done in the step's time.

- A training step over D tokens of a dense decoder with N parameters costs about 6·N·D FLOPs:
  2·N·D in the forward pass (a multiply and an add per parameter per token) and twice that in
  the backward pass (gradients of activations and of weights). N counts the parameters that
  multiply: the input embedding table is a lookup and is left out, unless it is tied to the
  output head (then it multiplies there). Attention's own score FLOPs (12·L·d·T per token,
  T the sequence length) are not counted, as in the usual 6·N·D figure; at seq_len ≪ 6·d they
  are small. D is every token of the global batch, padding included (it is computed).
- MFU = 6·N·D / (step_time · world_size · peak), `peak` per rank in FLOP/s: `peak_flops` when
  set (a vendor's figure: e.g. 989e12 for dense bf16 on an H100/H200 SXM), else measured at
  start as the best of a few square matmuls in the training dtype with the rank's threads —
  the attainable peak, above which no step can go, so MFU against it reads higher than against
  a spec sheet.
"""

from __future__ import annotations

import time

import torch

FLOPS_PER_PARAM_TOKEN = 6  # forward 2 + backward 4


def _weight(p: torch.nn.Parameter) -> float:
    # a frozen parameter (a LoRA run's base) costs 4 of the 6: forward, and the gradient of the
    # activations through it in backward, but no gradient of its own
    return 1.0 if p.requires_grad else 4 / FLOPS_PER_PARAM_TOKEN


def matmul_params(module: torch.nn.Module) -> int:
    """N of the 6·N·D rule: every parameter except an untied input embedding table, a frozen
    one counted for the 4 FLOPs per token it costs."""
    total = sum(p.numel() * _weight(p) for p in module.parameters())
    get_in, get_out = getattr(module, "get_input_embeddings", None), getattr(module, "get_output_embeddings", None)
    emb = get_in() if callable(get_in) else None
    head = get_out() if callable(get_out) else None
    if emb is not None and (head is None or head.weight is not emb.weight):
        total -= emb.weight.numel() * _weight(emb.weight)
    return round(total)


def step_flops(params: int, tokens: int) -> float:
    return float(FLOPS_PER_PARAM_TOKEN) * params * tokens


def mfu(flops: float, seconds: float, peak_per_rank: float, world_size: int) -> float | None:
    """The fraction of the ranks' peak the step used; None when it cannot be known."""
    if seconds <= 0 or peak_per_rank <= 0 or world_size <= 0:
        return None
    return flops / (seconds * peak_per_rank * world_size)


def measure_peak_flops(device: torch.device, dtype: torch.dtype, size: int | None = None, repeats: int = 20) -> float:
    """The best FLOP/s of `repeats` square matmuls of `size` (2·n³ FLOPs each) on `device`: the
    best, not the mean, so that a busy machine's interruptions do not lower the peak (about
    0.1 s on a CPU core)."""
    cuda = device.type == "cuda"
    n = size or (8192 if cuda else 512)
    inner = 10 if cuda else 1  # a GPU matmul takes about a millisecond: time several per sync
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    torch.matmul(a, b)  # warm-up: kernel selection, first-touch of the memory
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(inner):
            torch.matmul(a, b)
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 * inner / max(best, 1e-9)
