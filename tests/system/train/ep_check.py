"""Run by torchrun (2 ranks) from test_train_moe.py: expert parallelism against one process.

Every rank builds the same random MoE model, computes the single-process reference on the whole
batch (all experts local), then the expert-parallel model on its half of the rows (its half of
the experts, tokens sent by all_to_all, dense gradients averaged as DDP does), and writes the
largest differences of outputs, loss, every gradient and the clipped norm to OUT/rank-R.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh

from sluice.train.model.moe import make_moe, take_aux_loss
from sluice.train.parallel.expert import clip_grad_norm, shard_experts


def objective(model, ids: torch.Tensor, global_rows: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(input_ids=ids, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
    total = loss / (global_rows * ids.shape[1]) + take_aux_loss(model) / global_rows
    return logits, total * world


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0)
    dense = transformers.LlamaForCausalLM._from_config(cfg)
    build = lambda: make_moe(dense, experts=4, top_k=2, aux_coef=0.01, seed=3, upcycle=False)  # noqa: E731
    torch.manual_seed(7)
    ids = torch.randint(0, 64, (2 * world, 12))
    ref = build()
    ref_logits, ref_loss = objective(ref, ids, ids.shape[0], 1)
    ref_loss.backward()
    ep = build()
    group = dist.new_group()
    shards = shard_experts(ep, group, init_device_mesh("cpu", (world,)))
    per = ids.shape[0] // world
    mine = slice(rank * per, (rank + 1) * per)
    logits, loss = objective(ep, ids[mine], ids.shape[0], world)
    loss.backward()
    sharded = {id(p) for p in shards}
    for p in ep.parameters():  # what DDP does to the replicated parameters
        if id(p) not in sharded:
            dist.all_reduce(p.grad)
            p.grad /= world
    summed = loss.detach().clone() / world
    dist.all_reduce(summed)
    grads = {}
    experts = ep.config.num_local_experts // world
    for (name, p), (_, q) in zip(ref.named_parameters(), ep.named_parameters()):
        want = p.grad[rank * experts : (rank + 1) * experts] if id(q) in sharded else p.grad
        grads[name] = ((q.grad - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()
    norm_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    norm_ep = clip_grad_norm(ep, shards, group, 0.5)
    result = {
        "logits": (logits - ref_logits[mine]).abs().max().item(),
        "loss": abs(summed.item() - ref_loss.item()),
        "grads": grads,
        "norm": [norm_ref.item(), norm_ep.item()],
        "clipped": max(((q.grad - (p.grad[rank * experts : (rank + 1) * experts] if id(q) in sharded else p.grad))
                        .abs().max().item()) for p, q in zip(ref.parameters(), ep.parameters())),
        "tokens_per_expert_here": [int(s.shape[0]) for s in shards[:1]],
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
