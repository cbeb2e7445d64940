"""Run by torchrun (2 ranks) from test_train_moe.py: expert parallelism against one process.

A small model without transformers (it starts fast): embedding → MoE block → head. Every rank
builds the same one, computes the single-process reference on the whole batch (all experts
local), then the expert-parallel model on its half of the rows (its half of the experts, tokens
sent by all_to_all, the replicated gradients averaged as DDP does), and writes the largest
differences of outputs, loss, every gradient and the clipped norm to OUT/rank-R.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from sluice.train.model.moe import Experts, MoEBlock, Router, take_aux_loss
from sluice.train.parallel.clip import clip_grad_norm
from sluice.train.parallel.expert import shard_experts

VOCAB, WIDTH, INTER, EXPERTS, TOP_K = 64, 32, 48, 4, 2


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mlp = MoEBlock(
            Router(nn.Parameter(torch.randn(EXPERTS, WIDTH) * 0.3)),
            Experts(
                nn.Parameter(torch.randn(EXPERTS, 2 * INTER, WIDTH) * 0.2),
                nn.Parameter(torch.randn(EXPERTS, WIDTH, INTER) * 0.2),
                EXPERTS,
            ),
            TOP_K,
            aux_coef=0.01,
        )
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        return self.head(h + self.mlp(h))


def objective(model: Tiny, ids: torch.Tensor, global_rows: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """train/step.py's scaling: summed cross-entropy over the global token count, the balance
    loss over the global rows, times the world size (which the gradient average divides out)."""
    logits = model(ids)
    loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
    aux = take_aux_loss(model)
    assert aux is not None, "the MoE block recorded its balance loss"
    total = loss / (global_rows * (ids.shape[1] - 1)) + aux / global_rows
    return logits, total * world


def grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None, "every parameter has a gradient after backward"
    return p.grad


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(7)
    ids = torch.randint(0, VOCAB, (2 * world, 12))
    ref = Tiny()
    ref_logits, ref_loss = objective(ref, ids, ids.shape[0], 1)
    ref_loss.backward()
    ep = Tiny()
    group = dist.new_group()
    shards = shard_experts(ep, group, init_device_mesh("cpu", (world,)))
    per = ids.shape[0] // world
    mine = slice(rank * per, (rank + 1) * per)
    logits, loss = objective(ep, ids[mine], ids.shape[0], world)
    loss.backward()
    sharded = {id(p) for p in shards}
    for p in ep.parameters():  # what DDP does to the replicated parameters
        if id(p) not in sharded:
            dist.all_reduce(grad(p))
            grad(p).div_(world)
    summed = loss.detach().clone() / world
    dist.all_reduce(summed)
    local = EXPERTS // world

    def want(p: nn.Parameter, q: nn.Parameter) -> torch.Tensor:
        return grad(p)[rank * local : (rank + 1) * local] if id(q) in sharded else grad(p)

    grads = {
        name: ((grad(q) - want(p, q)).abs().max() / want(p, q).abs().max().clamp_min(1e-12)).item()
        for (name, p), (_, q) in zip(ref.named_parameters(), ep.named_parameters())
    }
    norm_ref = clip_grad_norm(list(ref.parameters()), 0.5, plain_copies=world)  # whole on every rank
    norm_ep = clip_grad_norm(list(ep.parameters()), 0.5, plain_copies=world, shared={p: 1 for p in shards})
    result = {
        "logits": (logits - ref_logits[mine]).abs().max().item(),
        "loss": abs(summed.item() - ref_loss.item()),
        "grads": grads,
        "norm": [norm_ref.item(), norm_ep.item()],
        "clipped": max((grad(q) - want(p, q)).abs().max().item() for p, q in zip(ref.parameters(), ep.parameters())),
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
