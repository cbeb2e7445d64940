"""`sluice train export RUN --out DIR`: a run's newest (or a chosen) checkpoint as an HF folder,
or, for a LoRA run, as PEFT's adapter folder (`--merge`: the base with the adapter merged in).

One process, no process group: DCP reads a checkpoint written by any number of ranks, DDP or
FSDP2, into a full unsharded model (resharding on load). The architecture and tokenizer come
from RUN/model/ (written by rank 0 at the run's start), so the export needs neither the original
model file nor the data. A LoRA adapter needs no base weights either (its checkpoint holds the
adapter: it is loaded into a model of the run's architecture, whose base weights are not
written); a merged export needs the run's base, rebuilt from the run's settings and checked
against the sha256 the run recorded (train/model/lora.py). The folder is written beside the
target and renamed into place, so a half-written export never looks like a model.
"""

from __future__ import annotations

import enum
import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

from sluice.train.checkpoint.store import CheckpointStore, open_store
from sluice.train.errors import CheckpointError
from sluice.train.settings import read_resolved


class ExportKind(str, enum.Enum):
    MODEL = "an HF model folder"
    ADAPTER = "a PEFT LoRA adapter folder"
    MERGED = "an HF model folder, the LoRA adapter merged into its base"


def _saved(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "resolved_config.json").read_text())
    except (OSError, ValueError):
        return {}


def _step_of(store: CheckpointStore, run_dir: Path, step: int | None) -> int:
    steps = store.complete_steps()
    if step is None:
        if not steps:
            raise CheckpointError(f"{run_dir} has no complete checkpoint (looked in {store.describe()})")
        return steps[-1]
    if step not in steps:
        have = ", ".join(map(str, steps)) or "none"
        raise CheckpointError(f"{run_dir} has no checkpoint of step {step} (complete: {have})")
    return step


def export_run(run_dir: Path, out: Path, step: int | None = None, merge: bool = False) -> tuple[int, Path, ExportKind]:
    saved = _saved(run_dir)
    lora = bool(saved.get("lora_rank"))
    if merge and not lora:
        raise CheckpointError(
            f"--merge applies to a LoRA run's adapter; {run_dir} trained the whole model "
            "(its export is a whole model folder already)"
        )
    store = open_store(run_dir, saved.get("checkpoint_store") or "", saved.get("s3_endpoint") or "")
    step = _step_of(store, run_dir, step)
    model_dir = run_dir / "model"
    if not (model_dir / "config.json").exists():
        raise CheckpointError(f"{model_dir} has no config.json: is {run_dir} a training run folder?")
    # checked first, imported after: a wrong step or folder is reported without torch's start-up
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from sluice.train.model.hf_files import write_model_folder

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    if lora:
        _export_lora(run_dir, model_dir, merge, lambda module: _load(store, step, module), tmp)
        kind = ExportKind.MERGED if merge else ExportKind.ADAPTER
    else:
        kind = ExportKind.MODEL
        config = AutoConfig.from_pretrained(str(model_dir))
        module = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _load(store, step, module)
        if config.tie_word_embeddings:
            module.tie_weights()
        write_model_folder(module, tmp, model_dir)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return step, out, kind


def _export_lora(run_dir: Path, model_dir: Path, merge: bool, load: Callable, out: Path) -> None:
    """The adapter (PEFT's folder), or its run's base with it merged in (an HF folder)."""
    from sluice.train.model import lora
    from sluice.train.model.build import build_model
    from sluice.train.replica.state import digest

    settings = read_resolved(run_dir / "resolved_config.json")
    if merge:  # the run's own base, rebuilt from its settings and checked against its record
        built = build_model(settings)
        lora.check_base(model_dir, digest(lora.frozen(built.module)), "the run trained against")
        module, peft_model = built.module, built.peft
    else:
        peft_model = lora.adapter_skeleton(settings, model_dir)
        module = peft_model.get_base_model()
    load(module)
    lora.write_lora(peft_model, merge, out, model_dir)


def _load(store: CheckpointStore, step: int, module) -> None:
    """The checkpoint's model state into `module` (a LoRA run's: its trainable part), checked
    against the checkpoint's manifest."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    from sluice.train.checkpoint.checkpointer import first_failure, model_state, state_options

    # the same state-dict function (and options) the run saved with: tied weights appear once,
    # under one name; a LoRA run's frozen base is not in its checkpoints
    state = {"model": model_state(module)[0]}
    reader = store.reader(step)  # checks what it reads against the checkpoint's manifest
    try:
        reader.check_metadata()
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=reader, no_dist=True)
    except CheckpointException as exc:  # its text is every rank's traceback: say the cause
        cause = first_failure(exc)
        raise CheckpointError(f"cannot read {store.describe()} step {step}: {cause}") from None
    finally:
        reader.close()
    set_model_state_dict(module, state["model"], options=state_options(module))
