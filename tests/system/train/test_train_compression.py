"""The DDP compression hooks, in a one-rank gloo group in this process: what each sends and that
error feedback loses nothing (top-K: what was not sent this step is sent later)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from sluice.train.parallel.comm_stats import CommStats
from sluice.train.parallel.compression import TOPK_RATIO, register_hook
from sluice.train.settings import Compression


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _flat_grads(module: torch.nn.Module) -> torch.Tensor:
    grads = [p.grad for p in module.parameters()]
    assert all(g is not None for g in grads), "every parameter has a gradient after backward"
    return torch.cat([g.flatten() for g in grads if g is not None])


def _grads(compression: Compression, steps: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    plain = [p.detach().clone() for p in model.parameters()]
    ref = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    for p, q in zip(ref.parameters(), plain):
        p.data.copy_(q)
    ddp = DDP(model)
    stats = CommStats()
    state = register_hook(ddp, compression, stats)
    sent, true = [], []
    for step in range(steps):
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(step))
        ddp(x).square().sum().backward()
        ref(x).square().sum().backward()
        sent.append(_flat_grads(model))
        true.append(_flat_grads(ref))
        model.zero_grad()
        ref.zero_grad()
    return sent, true, stats, state


@pytest.mark.parametrize(
    "compression, tol, ratio",
    [(Compression.NONE, 0.0, 1.0), (Compression.FP16, 1e-3, 0.5), (Compression.BF16, 1e-2, 0.5)],
)
def test_cast_hooks_send_the_gradient_in_fewer_bytes(group, compression, tol, ratio):
    sent, true, stats, _ = _grads(compression, 1)
    assert torch.allclose(sent[0], true[0], rtol=tol, atol=tol * true[0].abs().max())
    assert stats.bytes == int(ratio * 4 * true[0].numel())
    assert stats.seconds > 0


def test_topk_sends_one_percent_and_error_feedback_keeps_the_rest(group):
    sent, true, stats, state = _grads(Compression.TOPK, 3)
    n = true[0].numel()
    assert torch.equal(sent[0], true[0])  # the first step whole: DDP rebuilds its buckets after it
    assert int((sent[1] != 0).sum()) <= int(TOPK_RATIO * n) + 1
    assert stats.bytes < 4 * n + 0.05 * 2 * 4 * n
    # nothing is lost: everything computed = everything sent + the residual still held back
    # (the residual is in bucket order, the gradients in parameter order: compare them sorted)
    held = torch.cat([state.errors[i] for i in sorted(state.errors)])
    assert torch.allclose((sum(true[1:]) - sum(sent[1:])).sort().values, held.sort().values, atol=1e-5)
    assert float(held.abs().max()) > 0


def test_powersgd_sends_low_rank_factors_after_two_full_steps(group):
    sent, true, stats, _ = _grads(Compression.POWERSGD, 3)
    assert torch.allclose(sent[0], true[0])  # the first steps are uncompressed
    full = 4 * true[0].numel()
    assert stats.bytes < 3 * full  # the third step sent far less than a full gradient
