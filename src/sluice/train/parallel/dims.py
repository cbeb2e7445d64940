"""The parallel degrees of a run, computed once (as torchtitan's ParallelDims): how many ranks
train on different rows (dp), split each layer (tp) or hold a pipeline stage (pp), checked to
multiply to the world size, and the device mesh they make.

The launcher asks it at `nproc` ranks (settings validation, parallel/fit.py), every rank asks it
again at the world size torchrun gives (an elastic job may come back with another), and the
modes wrap the model on the mesh it builds. No torch at import: the settings import it before
any worker starts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class Parallel(str, enum.Enum):
    DDP = "ddp"  # DistributedDataParallel: replicated parameters, gradients all-reduced
    FSDP = "fsdp"  # FSDP2 fully_shard: parameters, gradients and optimizer state sharded
    # --- model parallelism (parallel/tensor.py, pipeline.py, modes.py) ---
    TP = "tp"  # tensor parallel over every rank: attention heads and MLP split (DTensor)
    PP = "pp"  # pipeline parallel: one stage of decoder layers per rank (GPipe or 1F1B)
    FSDP_TP = "fsdp_tp"  # 2-D mesh: FSDP2 over nproc / tp_size groups of tp_size tensor-parallel ranks
    # --- expert parallelism (parallel/expert.py) ---
    EP = "ep"  # expert parallel: MoE experts sharded over ranks (all_to_all), the rest as DDP


class PipelineSchedule(str, enum.Enum):
    """How a pipeline orders its micro-batches (parallel = pp)."""

    GPIPE = "gpipe"  # all forwards, then all backwards
    ONE_F_ONE_B = "1f1b"  # one forward, one backward in the steady state: fewer activations held


MODEL_PARALLEL = (Parallel.TP, Parallel.PP, Parallel.FSDP_TP)
DEFAULT_TP_SIZE = 2  # fsdp_tp's tensor-parallel degree when tp_size is 0


@dataclass(frozen=True, slots=True)
class ParallelDims:
    parallel: Parallel
    world: int
    dp: int  # data parallel: ranks that train on different rows of the global batch
    tp: int  # tensor parallel: ranks that split each layer (and share their rows)
    pp: int  # pipeline parallel: stages, one per rank (all see the whole batch)

    @classmethod
    def of(cls, parallel: Parallel, world: int, tp_size: int = 0) -> ParallelDims:
        """The degrees of `parallel` on `world` ranks; ValueError if they do not multiply to it."""
        tp = world if parallel is Parallel.TP else (tp_size or DEFAULT_TP_SIZE) if parallel is Parallel.FSDP_TP else 1
        pp = world if parallel is Parallel.PP else 1
        dims = cls(parallel, world, max(1, world // (tp * pp)), tp, pp)
        if dims.dp * dims.tp * dims.pp != world:
            raise ValueError(
                f"parallel = {parallel.value}: dp ({dims.dp}) x tp ({tp}) x pp ({pp}) ranks "
                f"do not make the world of {world}"
            )
        return dims

    @property
    def loss_copies(self) -> int:
        """Ranks that report the same rows' loss: a tensor-parallel group computes it once per
        rank; a pipeline's last stage alone computes it (the others report 0)."""
        return self.tp

    def data_rank(self, rank: int) -> int:
        """Which of the dp shares of the global batch `rank` trains on (the mesh is dp-major)."""
        return rank // (self.tp * self.pp)

    def micro_batch(self, batch_size: int, micro_batch_size: int) -> int:
        """Rows per forward on one rank (0: the rank's whole share; kept only if it divides it)."""
        per_rank = batch_size // self.dp
        return micro_batch_size if micro_batch_size and per_rank % micro_batch_size == 0 else per_rank

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """The device mesh the mode shards over (DDP and pipelines need none: asking is a bug)."""
        from torch.distributed.device_mesh import init_device_mesh

        if self.parallel is Parallel.TP:
            return init_device_mesh(device_type, (self.tp,), mesh_dim_names=("tp",))
        if self.parallel is Parallel.FSDP_TP:
            return init_device_mesh(device_type, (self.dp, self.tp), mesh_dim_names=("dp", "tp"))
        if self.parallel in (Parallel.FSDP, Parallel.EP):
            return init_device_mesh(device_type, (self.dp,), mesh_dim_names=("dp",))
        raise ValueError(f"parallel = {self.parallel.value} shards over no device mesh")
