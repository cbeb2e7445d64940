"""`sluice train export RUN --out DIR`: a run's newest (or a chosen) checkpoint as an HF folder.

One process, no process group: DCP reads a checkpoint written by any number of ranks, DDP or
FSDP2, into a full unsharded model (resharding on load). The architecture and tokenizer come
from RUN/model/ (written by rank 0 at the run's start), so the export needs neither the original
model file nor the data. The folder is written beside the target and renamed into place, so a
half-written export never looks like a model.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

from sluice.train.checkpoint.store import CheckpointStore, open_store
from sluice.train.errors import CheckpointError


def _store_of(run_dir: Path) -> CheckpointStore:
    """The run's checkpoint store, as its resolved settings name it (a folder or s3://)."""
    try:
        saved = json.loads((run_dir / "resolved_config.json").read_text())
    except (OSError, ValueError):
        saved = {}
    return open_store(run_dir, saved.get("checkpoint_store") or "", saved.get("s3_endpoint") or "")


def export_run(run_dir: Path, out: Path, step: int | None = None) -> tuple[int, Path]:
    store = _store_of(run_dir)
    steps = store.complete_steps()
    if step is None:
        if not steps:
            raise CheckpointError(f"{run_dir} has no complete checkpoint (looked in {store.describe()})")
        step = steps[-1]
    elif step not in steps:
        have = ", ".join(map(str, steps)) or "none"
        raise CheckpointError(f"{run_dir} has no checkpoint of step {step} (complete: {have})")
    path = f"{store.describe()} step {step}"
    model_dir = run_dir / "model"
    if not (model_dir / "config.json").exists():
        raise CheckpointError(f"{model_dir} has no config.json: is {run_dir} a training run folder?")
    # checked first, imported after: a wrong step or folder is reported without torch's start-up
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM

    from sluice.train.model.hf_files import write_model_folder

    config = AutoConfig.from_pretrained(str(model_dir))
    module = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from torch.distributed.checkpoint.api import CheckpointException

    from sluice.train.checkpoint.checkpointer import first_failure

    # the same state-dict function the run saved with: tied weights appear once, under one name
    state = {"model": get_model_state_dict(module)}
    reader = store.reader(step)  # checks what it reads against the checkpoint's manifest
    try:
        reader.check_metadata()
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=reader, no_dist=True)
    except CheckpointException as exc:  # its text is every rank's traceback: say the cause
        cause = first_failure(exc)
        raise CheckpointError(f"cannot read {path}: {cause}") from None
    finally:
        reader.close()
    set_model_state_dict(module, state["model"])
    if config.tie_word_embeddings:
        module.tie_weights()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    write_model_folder(module, tmp, model_dir)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return step, out
