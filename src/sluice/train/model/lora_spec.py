"""What a LoRA run trains, and the combinations refused before any worker starts (no torch: the
settings import this).

`--lora-rank R` trains PEFT's LoRA adapters on the chosen linears of every decoder layer
(train/model/lora.py) and freezes everything else. The targets are a closed vocabulary of
short names for the Llama family's seven linears, which are also the only targets the serving
side loads (docs/LORA.md).
"""

from __future__ import annotations

import enum

from sluice.train.parallel.dims import MODEL_PARALLEL, Parallel


class LoraTarget(str, enum.Enum):
    Q = "q"
    K = "k"
    V = "v"
    O = "o"  # noqa: E741 (the attention output projection's usual name)
    GATE = "gate"
    UP = "up"
    DOWN = "down"

    @property
    def module(self) -> str:
        """The linear's name in transformers' Llama-family modules (and in PEFT's target_modules)."""
        return f"{self.value}_proj"


ALL_TARGETS = tuple(LoraTarget)  # the default: every linear of every decoder layer (as QLoRA trains)


def default_alpha(rank: int) -> float:
    """alpha when not given: twice the rank (a scale alpha / r of 2, torchtune's recipes' choice)."""
    return 2.0 * rank


def targets_of(targets: list[LoraTarget] | None) -> list[str]:
    """The module names PEFT targets (`q_proj`, ...), in the vocabulary's order (None: all)."""
    chosen = set(targets if targets is not None else ALL_TARGETS)
    return [t.module for t in ALL_TARGETS if t in chosen]


def alpha_of(rank: int, alpha: float | None) -> float:
    return alpha if alpha is not None else default_alpha(rank)


def check(
    rank: int | None,
    alpha: float | None,
    dropout: float,
    targets: list[LoraTarget] | None,
    parallel: Parallel,
    moe_experts: int,
) -> None:
    """ValueError naming the setting for a LoRA combination sluice does not train."""
    if rank is None:
        given = {"lora_alpha": alpha is not None, "lora_dropout": dropout != 0.0, "lora_targets": targets is not None}
        if any(given.values()):
            field = next(f for f, set_ in given.items() if set_)
            raise ValueError(f"{field} applies to a LoRA run: set lora_rank (--lora-rank R)")
        return
    if targets is not None and not targets:
        raise ValueError("lora_targets: name at least one of " + ", ".join(t.value for t in ALL_TARGETS))
    if targets is not None and len(set(targets)) != len(targets):
        twice = next(t for t in targets if targets.count(t) > 1)
        raise ValueError(f"lora_targets: {twice.value!r} is listed twice")
    if parallel in (*MODEL_PARALLEL, Parallel.EP) or moe_experts:
        what = "moe_experts" if parallel in (Parallel.DDP, Parallel.FSDP) else f"parallel = {parallel.value}"
        raise ValueError(
            f"lora_rank: a LoRA run trains on one process, ddp or fsdp, not with {what} "
            "(tensor and pipeline plans split transformers' nn.Linear layers, which PEFT's LoRA layers wrap; "
            "a mixture of experts' feed-forward is not a target); train LoRA with parallel = ddp or fsdp"
        )
