"""LoRA training: PEFT's own LoRA layers in transformers' model, the base frozen.

PEFT (`get_peft_model`) replaces each targeted nn.Linear in place with its `lora.Linear`
(the frozen `base_layer`, `lora_A`, `lora_B`, the dropout) and freezes every other parameter;
the trainer then trains the same transformers module it trains in full fine-tuning, so DDP and
FSDP2 (`fully_shard` of each decoder layer: frozen and trainable parameters in one group, only
the trainable ones reduce-scattered), DCP checkpoints and the replica groups compose with it
unchanged. Its parameters' names are the module's (`model.layers.0.self_attn.q_proj.lora_A.
default.weight`); the PeftModel around it is kept only to write PEFT's adapter folder on export,
which is what serving loads (docs/LORA.md).

What sluice adds:
- a checkpoint holds the trainable parameters and their optimizer state only
  (checkpoint/checkpointer.py `model_state`: no name of a frozen tensor, a tied head included);
- the base must stay the one the run began with: its sha256 is recorded in RUN/model/base.json
  at the first start and checked on every start and by `export --merge`, so a run never resumes,
  nor merges, an adapter onto other weights than it trained against;
- each rank's digest of its frozen tensors at the start and the end of a run goes to
  RUN/events.jsonl (`base` events): equal digests, a base unchanged by training, bit for bit;
- dropout draws from a generator seeded by (seed, step, the rank's share of the batch), so a
  resumed run draws the same masks as the uninterrupted one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from sluice.train.errors import TrainHaltError
from sluice.train.model import lora_spec
from sluice.train.observe.events import Event, EventLog
from sluice.train.replica.state import digest
from sluice.train.settings import BUNDLED, TrainSettings

BASE_RECORD = "base.json"  # in RUN/model/: what the adapter was trained against


def base_name(settings: TrainSettings) -> str:
    """The adapter config's base_model_name_or_path: a model folder's (or .gguf file's) absolute
    path, "bundled", or the random preset's name (`random:tiny`, drawn from the run's seed)."""
    if settings.model == BUNDLED or settings.is_random:
        return settings.model
    return str(Path(settings.model).expanduser().resolve())


def lora_config(settings: TrainSettings) -> Any:
    from peft import LoraConfig

    assert settings.lora_rank is not None
    alpha = lora_spec.alpha_of(settings.lora_rank, settings.lora_alpha)
    return LoraConfig(
        r=settings.lora_rank,
        lora_alpha=int(alpha) if alpha.is_integer() else alpha,  # type: ignore[arg-type]
        lora_dropout=settings.lora_dropout,
        target_modules=lora_spec.targets_of(settings.lora_targets),
        bias="none",
        task_type="CAUSAL_LM",
    )


def add_lora(module: torch.nn.Module, settings: TrainSettings, base: str | None = None) -> Any:
    """Inject LoRA into `module` in place (its targeted linears wrapped, every base parameter
    frozen); the PeftModel around it (`.get_base_model()` is `module`)."""
    from peft import get_peft_model

    torch.manual_seed(settings.seed)  # lora_A's initialisation: the same on every rank (FSDP2 shards it as is)
    # autocast_adapter_dtype=False: the adapters in the base's dtype (FSDP2 shards a layer's
    # parameters as one group, which must share a dtype)
    peft_model = get_peft_model(module, lora_config(settings), autocast_adapter_dtype=False)
    # set after: get_peft_model names the base by the module's name_or_path (as the run's flag
    # spelt it, or "" for a module made from a config)
    peft_model.peft_config["default"].base_model_name_or_path = base or base_name(settings)
    if settings.lora_dropout:
        module.train()  # dropout acts in training mode only (transformers loads models in eval mode)
    return peft_model


def seed_dropout(settings: TrainSettings, step: int, share: int) -> None:
    """The masks of this step on this share of the batch, the same after a resume."""
    if settings.lora_dropout:
        torch.manual_seed(((settings.seed * 1_000_003 + step) * 4099 + share) % (1 << 63))


def frozen(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if not p.requires_grad]


class FrozenBase:
    """The base of a LoRA run, checked against the run's record and watched while it trains."""

    def __init__(self, module: torch.nn.Module, settings: TrainSettings, run_dir: Path, writes: bool):
        """`module`: the whole model on this rank, before any sharding. Every rank checks (and
        halts together); `writes` (rank 0 of the group that writes checkpoints) records it first."""
        self.sha256 = digest(frozen(module))
        check_base(run_dir / "model", self.sha256, "this run was started with", write=writes, name=base_name(settings))
        self.start: str | None = None
        self.events: EventLog | None = None

    def watch(self, wrapped: torch.nn.Module, events: EventLog) -> None:
        """This rank's frozen tensors (its shards under FSDP2) as training starts."""
        self.wrapped, self.events = wrapped, events
        self.start = digest(frozen(wrapped))
        events.emit(Event.BASE, at="start", sha256=self.start)

    def finish(self) -> None:
        assert self.events is not None
        end = digest(frozen(self.wrapped))
        self.events.emit(Event.BASE, at="end", sha256=end, unchanged=end == self.start)


def check_base(model_dir: Path, sha256: str, what: str, write: bool = False, name: str = "") -> None:
    """Halt if RUN/model/base.json names another base than `sha256`; record it if absent and `write`."""
    record = model_dir / BASE_RECORD
    try:
        saved = json.loads(record.read_text())
    except FileNotFoundError:
        if write:
            model_dir.mkdir(parents=True, exist_ok=True)
            tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"base_model_name_or_path": name, "sha256": sha256}, indent=2) + "\n")
            tmp.replace(record)
        return
    if saved.get("sha256") != sha256:
        raise TrainHaltError(
            f"the base model ({saved.get('base_model_name_or_path')}) differs from the one {what} "
            f"(sha256 of its weights {sha256[:12]}..., recorded {str(saved.get('sha256'))[:12]}... "
            f"in {record}): an adapter only fits the base it was trained on"
        )


def recorded_base(model_dir: Path) -> str | None:
    """The base_model_name_or_path the run recorded (None: not recorded)."""
    try:
        return json.loads((model_dir / BASE_RECORD).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError):
        return None


def adapter_skeleton(settings: TrainSettings, model_dir: Path) -> Any:
    """A model of the run's architecture (RUN/model/config.json) with its LoRA layers, for the
    adapter's export: the PeftModel; its base weights are not the run's and are not written."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    module = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, settings.dtype))
    return add_lora(module, settings, recorded_base(model_dir) or base_name(settings))


def write_lora(peft_model: Any, merge: bool, out: Path, model_dir: Path) -> None:
    """PEFT's adapter folder, or (`merge`) the base with the adapter merged in as an HF folder."""
    from sluice.train.model.hf_files import write_model_folder

    if merge:
        write_model_folder(peft_model.merge_and_unload(), out, model_dir)
    else:
        # save_embedding_layers=False: PEFT's "auto" looks the base's name up on the Hub
        peft_model.save_pretrained(str(out), save_embedding_layers=False)
