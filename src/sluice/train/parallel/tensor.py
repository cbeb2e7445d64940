"""Tensor parallelism (Megatron-style) with DTensor's `parallelize_module`.

Each decoder layer's attention is split by heads and its MLP by the intermediate dimension:
q/k/v and gate/up are `ColwiseParallel` (each rank computes its share of the heads / of the
intermediate features, no communication), o and down are `RowwiseParallel` (each rank's
partial product is all-reduced into the replicated hidden state). Two all-reduces per layer in
the forward pass, two in the backward. transformers' attention infers the local head count
from the projection's width (`view(..., -1, head_dim)`), so the module is used unchanged; GQA
stays intact as long as both head counts divide by the tensor-parallel degree.

Embeddings, norms and the LM head are replicated: every rank of the group sees the same tokens
and computes the same gradients for them, so they need no synchronisation. They are made
`Replicate` DTensors all the same (inputs wrapped, outputs unwrapped around each of those
modules), because torch 2.13's foreach kernels refuse a list that mixes DTensor and plain
tensors: AdamW(foreach=True) failed with "got mixed torch.Tensor and DTensor" on gloo/CPU.
With every parameter a DTensor the optimizer is unchanged, and FSDP2 can shard the result
on a 2-D mesh (fsdp_tp, parallel/modes.py). Gradient clipping is parallel/clip.py's, which weighs
each gradient by how many ranks hold it.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh

from sluice.train.model.causal_lm import layer_norms, parts
from sluice.train.parallel.fit import check_divisible

LAYER_PLAN_NAMES = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


def _layer_plan() -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    # colwise outputs stay local shards (the next op is per-head attention / the elementwise
    # SiLU·up product); rowwise inputs are those local shards and outputs are all-reduced
    # (Replicate) back into plain tensors for the residual stream
    return {
        name: ColwiseParallel() if kind == "colwise" else RowwiseParallel() for name, kind in LAYER_PLAN_NAMES.items()
    }


def _to_replicate(_module, inputs, mesh: DeviceMesh):
    from torch.distributed.tensor import DTensor, Replicate

    return tuple(
        DTensor.from_local(x, mesh, [Replicate()], run_check=False)
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
        else x
        for x in inputs
    )


def _to_local(_module, output, _mesh: DeviceMesh):
    return output.to_local() if hasattr(output, "to_local") else output


def _replicated_modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules outside the sharded linears that hold parameters (embeddings, norms, head)."""
    whole = parts(module)
    out: list[torch.nn.Module] = [whole.embed_tokens, whole.norm]
    for layer in whole.layers:
        out += layer_norms(layer)
    if not whole.config.tie_word_embeddings:
        out.append(whole.lm_head)  # tied: the embedding's DTensor, already replicated
    return out


def apply_tensor_parallel(module: torch.nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard every decoder layer of a *ForCausalLM in place over `tp_mesh` (1-D)."""
    from torch.distributed.tensor.parallel import parallelize_module

    whole = parts(module)
    check_divisible(whole.config, tp_mesh.size())
    for layer in whole.layers:
        parallelize_module(layer, tp_mesh, _layer_plan())
    from torch.distributed.tensor import distribute_module

    for part in _replicated_modules(module):
        distribute_module(part, tp_mesh, input_fn=_to_replicate, output_fn=_to_local)
    if whole.config.tie_word_embeddings:
        # the head shares the embedding's parameter, now a DTensor: its input must be one too
        whole.lm_head.register_forward_pre_hook(lambda mod, inputs: _to_replicate(mod, inputs, tp_mesh))
        whole.lm_head.register_forward_hook(lambda mod, inputs, out: _to_local(mod, out, tp_mesh))
        whole.lm_head.weight = whole.embed_tokens.weight


# All-reduces per decoder layer and forward + backward, each of the hidden states' size: 2 in the
# forward (o and down outputs) and 5 in the backward (the input gradient of each colwise
# projection, q, k, v, gate, up, is reduced on its own: counted on gloo with torch 2.13; Megatron
# fuses q/k/v and gate/up, which would make it 2).
ALL_REDUCES_PER_LAYER = 7


def count_traffic(module: torch.nn.Module, stats, extra_per_forward: int = 0) -> None:
    """Add the tensor-parallel all-reduce bytes of each forward (and its backward) to `stats`
    (metrics.jsonl's comm_bytes), plus `extra_per_forward` (FSDP2's gathers under fsdp_tp)."""
    whole = parts(module)
    per_token = ALL_REDUCES_PER_LAYER * len(whole.layers) * whole.config.hidden_size
    elem = whole.embed_tokens.weight.element_size()

    def hook(_mod, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        stats.bytes += per_token * elem * ids.numel() + extra_per_forward

    module.register_forward_pre_hook(hook, with_kwargs=True)
