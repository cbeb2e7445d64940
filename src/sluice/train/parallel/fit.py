"""Before any worker starts: does the model's shape fit the parallel mode? (launch.prepare)

Tensor parallelism splits attention heads, KV heads and the MLP width over its ranks; a
pipeline needs a decoder layer per stage and, under 1F1B, at least as many micro-batches as
stages. The workers check the same at start (the world size may differ after an elastic
restart), but a mistake found there would cost a torchrun start and its restarts: the launcher
reads the model's shape (config.json, the GGUF header, or the preset; no weights) and refuses
first, naming the setting. No torch here: the launcher imports this before any worker starts.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from sluice.train.errors import TrainConfigError
from sluice.train.model.hf_fields import hf_values
from sluice.train.model.source import model_path
from sluice.train.parallel.dims import MODEL_PARALLEL, Parallel, PipelineSchedule
from sluice.train.settings import RANDOM_PREFIX, TrainSettings


def check_divisible(config, degree: int, setting: str = "parallel") -> None:
    """Heads, KV heads and the MLP width must split evenly over the tensor-parallel ranks."""
    problems = []
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, name)
        if value % degree:
            problems.append(f"{name} ({value})")
    if problems:
        raise TrainConfigError(
            [
                f"{setting}: tensor parallelism over {degree} ranks needs {', '.join(problems)} "
                f"divisible by {degree}; choose another nproc / tp_size or another parallel mode"
            ]
        )


def split_layers(n_layers: int, stages: int) -> list[range]:
    """Contiguous layer ranges per stage; the first stages take the remainder (the last stage
    also carries the LM head, often the largest matrix)."""
    if stages > n_layers:
        raise TrainConfigError(
            [
                f"parallel: pipeline over {stages} ranks needs at least {stages} decoder layers "
                f"(the model has {n_layers}); use fewer processes"
            ]
        )
    base, extra = divmod(n_layers, stages)
    out, start = [], 0
    for s in range(stages):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The idle share of a GPipe / 1F1B step with equal stages: (p − 1) / (m + p − 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def pipeline_micro_batches(settings: TrainSettings) -> int:
    """A pipeline's micro-batches per step: micro_batch_size rows each (default one row)."""
    return settings.batch_size // (settings.micro_batch_size or 1)


def check_schedule(schedule: PipelineSchedule, micro_batches: int, stages: int) -> None:
    if schedule is PipelineSchedule.ONE_F_ONE_B and micro_batches < stages:
        raise TrainConfigError(
            [
                f"pp_schedule: 1f1b needs at least as many micro-batches as stages "
                f"({micro_batches} < {stages}); raise batch_size, lower micro_batch_size or use gpipe"
            ]
        )


# what the parallel modes split, in transformers' names
SHAPE_FIELDS = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "num_hidden_layers")


def model_shape(settings: TrainSettings) -> SimpleNamespace:
    """heads, KV heads, MLP width and layers of the run's model, in transformers' names."""
    if settings.is_random:
        from sluice.train.model.presets import PRESETS

        cfg = dict(PRESETS[settings.model.removeprefix(RANDOM_PREFIX)])
    else:
        # sluice's own reading of the model (the one serving uses): heads, widths, window
        from sluice.models.config import ModelConfig

        path = model_path(settings.model)
        if path.is_dir():
            c = ModelConfig.from_hf_dict(json.loads((path / "config.json").read_text()))
        else:
            from sluice.models.gguf.metadata import file_config, open_gguf

            c = file_config(open_gguf(path))
        cfg = hf_values(c, (*SHAPE_FIELDS, "sliding_window"))
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    return SimpleNamespace(
        sliding_window=cfg.get("sliding_window"),
        **{k: cfg[k] for k in SHAPE_FIELDS},
    )


def check_fits(settings: TrainSettings) -> None:
    if settings.parallel not in MODEL_PARALLEL:
        return
    shape = model_shape(settings)
    dims = settings.dims()
    if settings.parallel is Parallel.PP:
        split_layers(shape.num_hidden_layers, dims.pp)
        if shape.sliding_window is not None and settings.seq_len > shape.sliding_window:
            raise TrainConfigError(
                [
                    f"seq_len: rows of {settings.seq_len} tokens exceed the model's sliding window "
                    f"({shape.sliding_window}), which pipeline stages do not apply; use "
                    f"seq_len <= {shape.sliding_window} or another parallel mode"
                ]
            )
        check_schedule(settings.pp_schedule, pipeline_micro_batches(settings), dims.pp)
        return
    check_divisible(shape, dims.tp)
