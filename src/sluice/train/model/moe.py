"""A mixture-of-experts feed-forward for the training model: top-k gating over SwiGLU experts.

`moe_experts = E` turns the model into transformers' own MixtralForCausalLM (Llama attention,
a routed MoE feed-forward in every layer) and then swaps each layer's MoE block for `MoEBlock`
below, which keeps Mixtral's parameter names and math (softmax router, top-k, the k weights
renormalised to sum to 1, SwiGLU experts) but whose experts may live on other ranks: the block
groups its token assignments by expert and hands them to a dispatcher, in one process the local
one, under expert parallelism the all_to_all one of train/parallel/expert.py. Because the names
are Mixtral's, a checkpoint exports as a Mixtral HF folder that transformers loads as it is.

Where the weights come from: a `random:<preset>` model draws every expert from the seed; a
loaded dense model is *upcycled* (every expert starts as a copy of the layer's dense MLP, the
router from the seed), so the MoE model starts out computing exactly what the dense one did.

Load balancing: a sequence-wise auxiliary loss (as DeepSeek-V3's), per row
`E · Σ_e f_e · P_e` (f_e: the row's share of assignments to expert e, P_e: its mean router
probability), 1 when balanced. Being a sum over rows, it does not depend on how the global
batch is split over ranks and micro-batches, so expert parallelism still equals one process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from sluice.errors import ModelLoadError
from sluice.models.config import HF_SHAPE

# run(tokens grouped by local expert, rows per local expert) -> their outputs, same order
RunLocal = Callable[[torch.Tensor, list[int]], torch.Tensor]


class Dispatcher(Protocol):
    def __call__(self, xs: torch.Tensor, counts: torch.Tensor, run_local: RunLocal) -> torch.Tensor:
        """Outputs for `xs` (assignments grouped by global expert, `counts[e]` rows each)."""
        ...


def local_dispatch(xs: torch.Tensor, counts: torch.Tensor, run_local: RunLocal) -> torch.Tensor:
    return run_local(xs, counts.tolist())


class Router(nn.Module):
    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight  # [E, hidden]


class Experts(nn.Module):
    """The SwiGLU weights of this rank's experts, stacked like transformers' MixtralExperts."""

    def __init__(self, gate_up_proj: nn.Parameter, down_proj: nn.Parameter, num_experts: int):
        super().__init__()
        self.gate_up_proj = gate_up_proj  # [local experts, 2 · intermediate, hidden]
        self.down_proj = down_proj  # [local experts, hidden, intermediate]
        self.num_experts = num_experts  # over all ranks
        self.mesh = None  # set by expert parallelism: the 1-D mesh the stack is sharded on (dim 0)

    def run(self, xs: torch.Tensor, counts: list[int]) -> torch.Tensor:
        outs = []
        for e, chunk in enumerate(xs.split(counts)):
            if chunk.shape[0]:
                gate, up = F.linear(chunk, self.gate_up_proj[e]).chunk(2, dim=-1)
                outs.append(F.linear(F.silu(gate) * up, self.down_proj[e]))
        # touch the weights even when no token came: every step then gives them a gradient (zeros
        # where unused), so AdamW steps every shard exactly as one process steps the whole stack
        touch = 0.0 * (self.gate_up_proj.sum() + self.down_proj.sum())
        if not outs:
            return xs.new_zeros((0, self.down_proj.shape[1])) + touch
        return torch.cat(outs) + touch


class MoEBlock(nn.Module):
    def __init__(self, router: Router, experts: Experts, top_k: int, aux_coef: float):
        super().__init__()
        self.gate = router
        self.experts = experts
        self.top_k = top_k
        self.aux_coef = aux_coef
        self.dispatch: Dispatcher = local_dispatch
        self.aux: torch.Tensor | None = None  # this forward's weighted load-balancing loss (summed over rows)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows, seq, width = hidden.shape
        x = hidden.reshape(-1, width)
        probs = F.linear(x, self.gate.weight).float().softmax(dim=-1)  # [N, E]
        top_w, top_i = probs.topk(self.top_k, dim=-1)
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        n_exp = probs.shape[-1]
        if self.aux_coef and torch.is_grad_enabled():
            share = torch.zeros(rows, n_exp, dtype=probs.dtype, device=x.device)
            share.scatter_add_(1, top_i.view(rows, -1), torch.ones_like(top_w).view(rows, -1))
            share /= seq * self.top_k
            self.aux = self.aux_coef * n_exp * (share * probs.view(rows, seq, n_exp).mean(1)).sum()
        flat = top_i.reshape(-1)
        order = flat.argsort(stable=True)  # assignments grouped by expert, token order within
        token = order // self.top_k
        counts = torch.bincount(flat, minlength=n_exp)
        ys = self.dispatch(x[token], counts, self.experts.run)
        ys = ys * top_w.reshape(-1)[order].unsqueeze(-1).to(ys.dtype)
        return torch.zeros_like(x).index_add_(0, token, ys).view(rows, seq, width)


def blocks(module: nn.Module) -> list[tuple[str, MoEBlock]]:
    return [(name, m) for name, m in module.named_modules() if isinstance(m, MoEBlock)]


def take_aux_loss(module: nn.Module) -> torch.Tensor | None:
    """The load-balancing loss of the last forward, summed over layers and rows (then cleared)."""
    total = None
    for _, block in blocks(module):
        if block.aux is not None:
            total = block.aux if total is None else total + block.aux
            block.aux = None
    return total


def mixtral_config(dense, experts: int, top_k: int, aux_coef: float):
    """The Mixtral config of a dense Llama/Mistral config with `experts` experts per layer."""
    import transformers

    kind = dense.model_type
    if kind not in ("llama", "mistral", "mixtral"):
        raise ModelLoadError(f"moe_experts: a {kind} model cannot be made a mixture of experts (llama or mistral)")
    if getattr(dense, "attention_bias", False) or getattr(dense, "mlp_bias", False):
        raise ModelLoadError("moe_experts: the model has attention or MLP biases, which Mixtral has not")
    if dense.hidden_act != "silu":
        raise ModelLoadError(f"moe_experts: the experts are SwiGLU (silu); the model uses {dense.hidden_act}")
    keep = (
        "vocab_size",
        *HF_SHAPE,
        "head_dim",
        "initializer_range",
        "rms_norm_eps",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "tie_word_embeddings",
        "rope_parameters",
    )
    fields = {k: getattr(dense, k) for k in keep if getattr(dense, k, None) is not None}
    return transformers.MixtralConfig(
        **fields,
        sliding_window=getattr(dense, "sliding_window", None),
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        router_aux_loss_coef=aux_coef,
        output_router_logits=False,
        use_cache=False,
    )


def make_moe(dense: nn.Module, experts: int, top_k: int, aux_coef: float, seed: int, upcycle: bool) -> nn.Module:
    """A MixtralForCausalLM from `dense` (its config; its weights too when `upcycle`), with
    `MoEBlock` feed-forwards. Seeded: every rank builds the same model."""
    import transformers

    config = mixtral_config(dense.config, experts, top_k, aux_coef)
    torch.manual_seed(seed + 1)  # the router (and random experts): same on every rank
    moe = transformers.MixtralForCausalLM._from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    if upcycle:
        dense_sd = dense.state_dict()
        missing, unexpected = moe.load_state_dict(dense_sd, strict=False)
        if any(".mlp." not in k for k in missing + unexpected if k != "lm_head.weight"):
            raise ModelLoadError(f"moe_experts: cannot upcycle (missing {missing[:3]}, unexpected {unexpected[:3]})")
        with torch.no_grad():
            for i, layer in enumerate(moe.model.layers):
                p = f"model.layers.{i}.mlp."
                gate_up = torch.cat([dense_sd[p + "gate_proj.weight"], dense_sd[p + "up_proj.weight"]])
                layer.mlp.experts.gate_up_proj.copy_(gate_up.expand_as(layer.mlp.experts.gate_up_proj))
                layer.mlp.experts.down_proj.copy_(
                    dense_sd[p + "down_proj.weight"].expand_as(layer.mlp.experts.down_proj)
                )
        if config.tie_word_embeddings:
            moe.tie_weights()
    for layer in moe.model.layers:
        old = layer.mlp
        layer.mlp = MoEBlock(
            Router(old.gate.weight), Experts(old.experts.gate_up_proj, old.experts.down_proj, experts), top_k, aux_coef
        )
    moe.config.use_cache = False
    return moe
