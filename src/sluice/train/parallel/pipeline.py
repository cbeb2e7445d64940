"""Pipeline parallelism with `torch.distributed.pipelining`: stages split by decoder layers,
driven by a GPipe or 1F1B schedule over micro-batches.

Rank s of p holds stage s: a contiguous run of decoder layers (the first stage also the token
embeddings, the last the final norm and the LM head). Every rank builds the full model from the
same seed or file and keeps only its part (the rest is freed), so the stage's weights are
exactly the one-process model's. The stage module keeps the full model's parameter names
(`model.layers.7.mlp...`, layers in a ModuleDict keyed by their global index): a checkpoint
written by a pipeline has the same keys as one written by DDP or FSDP2, and DCP loads it into
any other mode, and back.

Tied embeddings (SmolLM2, the random presets): the first stage uses the matrix as embeddings,
the last as the LM head. Both keep a copy under the one name `model.embed_tokens.weight`, their
gradients are summed over the two ranks after the backward pass (what one process accumulates
into the shared tensor), so the copies stay equal through every update, and DCP saves the name
once, as a replicated tensor.

The loss is the global batch's mean over trained tokens, as in step.py: each micro-batch's
summed cross-entropy divided by the step's trained-token count, so the schedule must not scale
gradients by the number of micro-batches (`scale_grads=False`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

from sluice.train.model.causal_lm import parts
from sluice.train.parallel.dims import PipelineSchedule
from sluice.train.parallel.fit import check_schedule, split_layers

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle


class _StageDecoder(torch.nn.Module):
    """A stage's `model.`: the parts of the full model's decoder this stage holds, under their names."""

    # declared for the type checker; set in StageModule.__init__ (embeddings and norm by some stages only)
    embed_tokens: torch.nn.Embedding
    layers: torch.nn.ModuleDict
    rotary_emb: torch.nn.Module
    norm: torch.nn.Module


class StageModule(torch.nn.Module):
    """One stage of a *ForCausalLM: embeddings (first), some decoder layers, norm and head (last).

    Attribute paths mirror the full model's, so parameter names do too."""

    lm_head: torch.nn.Linear  # the last stage's

    def __init__(self, full: torch.nn.Module, layers: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        whole = parts(full)
        config = whole.config
        self.tied = bool(config.tie_word_embeddings)
        self.hidden = int(config.hidden_size)  # the width of what passes between stages
        # Mistral / Qwen2 sliding windows live in the full model's mask, which a stage does not
        # build: rows longer than the window are refused (launch checks seq_len first, fit.py)
        self.window = getattr(config, "sliding_window", None)
        self.model = _StageDecoder()
        if first or (last and self.tied):
            self.model.embed_tokens = whole.embed_tokens
        self.model.layers = torch.nn.ModuleDict({str(i): whole.layers[i] for i in layers})
        self.model.rotary_emb = whole.rotary_emb
        if last:
            self.model.norm = whole.norm
            self.lm_head = whole.lm_head
            if self.tied:
                self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.window is not None and x.shape[1] > self.window:
            raise RuntimeError(
                f"pipeline stages attend causally without a sliding window: rows of "
                f"{x.shape[1]} tokens exceed the model's window of {self.window}"
            )
        h = self.model.embed_tokens(x) if self.first else x
        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        rope = self.model.rotary_emb(h, position_ids=positions)
        for layer in self.model.layers.values():
            # no mask: transformers' SDPA path then attends causally (is_causal), as the full
            # model does on unpadded packed rows
            h = layer(h, attention_mask=None, position_embeddings=rope, position_ids=positions)
        if self.last:
            h = self.lm_head(self.model.norm(h))
        return h

    def shared_copies(self) -> dict[torch.Tensor, int]:
        """Parameters held by more than one rank, for parallel/clip.py: the tied matrix, twice."""
        weight = self.tied_weight()
        return {weight: 2} if weight is not None and not (self.first and self.last) else {}

    def tied_weight(self) -> torch.Tensor | None:
        """The embedding matrix when this stage shares it with the other end of the pipeline."""
        return self.model.embed_tokens.weight if self.tied and (self.first or self.last) else None


@dataclass(slots=True)
class StepLoss:
    """The last stage's loss function: each micro-batch's summed cross-entropy times `scale` (one
    over the step's trained tokens); `parts` keeps the unscaled sums the step reports."""

    parts: list[torch.Tensor]
    scale: float = 1.0

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss_sum = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=-100, reduction="sum")
        self.parts.append(loss_sum.detach())
        return loss_sum * self.scale


@dataclass(slots=True)
class Pipeline:
    stage: StageModule
    schedule: PipelineScheduleSingle
    stages: int
    micro_batches: int
    tied_group: dist.ProcessGroup | None  # the {first, last} process group summing the tied gradient
    loss: StepLoss  # the current step's (last stage)


def build(full: torch.nn.Module, device: torch.device, schedule: PipelineSchedule, micro_batches: int) -> Pipeline:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    check_schedule(schedule, micro_batches, world)  # the world may differ from nproc after a restart
    ranges = split_layers(parts(full).config.num_hidden_layers, world)
    stage_mod = StageModule(full, ranges[rank], rank == 0, rank == world - 1).to(device)
    parts(full).decoder.layers = torch.nn.ModuleList()  # the other stages' layers: freed with the last reference
    tied_group = None
    if stage_mod.tied and world > 1:
        tied_group = dist.new_group([0, world - 1])  # every rank must take part in creating it
    loss = StepLoss([])
    stage = PipelineStage(stage_mod, rank, world, device)
    cls = ScheduleGPipe if schedule is PipelineSchedule.GPIPE else Schedule1F1B
    steps = cls(stage, micro_batches, loss_fn=loss, scale_grads=False)
    return Pipeline(stage_mod, steps, world, micro_batches, tied_group, loss)


def sent_bytes(pipe: Pipeline, rows: int, seq_len: int) -> int:
    """Bytes this stage sends in one step: the hidden states of every micro-batch forward (all
    but the last stage), their gradients backward (all but the first), and the tied gradient."""
    elem = next(pipe.stage.parameters()).element_size()
    activations = rows * seq_len * pipe.stage.hidden * elem
    out = activations * ((not pipe.stage.last) + (not pipe.stage.first))
    weight = pipe.stage.tied_weight()
    if weight is not None and pipe.tied_group is not None:
        out += weight.numel() * weight.element_size()
    return out


def targets(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token targets aligned with the logits' positions, -100 where no loss falls."""
    out = torch.full_like(tokens, -100)
    out[:, :-1] = tokens[:, 1:].masked_fill(~mask[:, 1:], -100)
    return out


def train_step(pipe: Pipeline, tokens: torch.Tensor, mask: torch.Tensor, global_tokens: int) -> torch.Tensor:
    """Forward and backward of the whole batch through the pipeline; the summed loss (last
    stage; zero elsewhere), detached. Tied gradients are summed before returning."""
    pipe.loss.parts.clear()
    pipe.loss.scale = 1.0 / max(1, global_tokens)
    if pipe.stage.first and pipe.stage.last:
        raise RuntimeError("a pipeline needs at least 2 ranks")
    if pipe.stage.first:
        pipe.schedule.step(tokens)
    elif pipe.stage.last:
        pipe.schedule.step(target=targets(tokens, mask))
    else:
        pipe.schedule.step()
    weight = pipe.stage.tied_weight()
    if weight is not None and pipe.tied_group is not None:
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        dist.all_reduce(weight.grad, group=pipe.tied_group)
    total = torch.zeros((), dtype=torch.float64)
    # the schedule's first step also calls the loss function while inferring shapes (on
    # placeholder tensors): the step's real losses are the last `micro_batches` calls
    parts = pipe.loss.parts
    for part in parts[len(parts) - pipe.micro_batches :] if pipe.stage.last else ():
        total += part.double().cpu()
    return total
