"""LoRA training: PEFT's adapters on the tiny Llama folder, trained by real torchrun groups (DDP and
FSDP2, 2 ranks) and in one process. Only the adapter trains (each rank's frozen base has the same
sha256 at the end as at the start, and the folder's own), checkpoints hold the adapter and its
AdamW state only, a kill -9 resumes exactly (dropout included), and the export is a PEFT adapter
folder whose logits under `PeftModel.from_pretrained` equal sluice's trained model's; `--merge`
writes a whole model folder equal to the PEFT model."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from sluice.train.checkpoint import layout
from sluice.train.checkpoint.manifest import read_manifest, verify_file
from sluice.train.errors import TrainHaltError
from sluice.train.model.lora_spec import LoraTarget
from tests.system.train.conftest import (
    ADAPTER_PARAMS,
    COMMON,
    LORA,
    RUN_TIMEOUT_S,
    STEPS,
    base_sha256,
    events,
    losses,
    run_in_process,
    run_train,
    train_cmd,
)

VOCAB = 259  # the tiny folder's byte-level vocabulary


@pytest.fixture(scope="module")
def lora_fsdp2(train_dir: Path, tiny_folder: Path, chat_data: Path) -> Path:
    out = train_dir / "lora-fsdp2"
    run_train(
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        "--nproc",
        "2",
        "--parallel",
        "fsdp",
        *LORA,
        *COMMON,
    )
    return out


def test_only_the_adapter_trains_on_one_process_ddp_and_fsdp(tiny_folder, lora_one, lora_ddp2, lora_fsdp2):
    folder_sha = base_sha256(tiny_folder)
    for run, ranks in ((lora_one, 1), (lora_ddp2, 2), (lora_fsdp2, 2)):
        assert json.loads((run / "model" / "base.json").read_text()) == {
            "base_model_name_or_path": str(tiny_folder.resolve()),
            "sha256": folder_sha,
        }
        digests = {(e["rank"], e["at"]): e["sha256"] for e in events(run, "base")}
        assert {r for r, _ in digests} == set(range(ranks)), run
        for rank in range(ranks):  # each rank's frozen tensors (its shards under FSDP2), bit for bit
            assert digests[(rank, "end")] == digests[(rank, "start")], (run, rank)
        if run is not lora_fsdp2:  # a whole replica of the base on each rank: the folder's weights
            assert {digests[(r, "start")] for r in range(ranks)} == {folder_sha}
        got = losses(run)
        assert len(got) == STEPS and got[-1] < got[0], "the adapter learns"
    # FSDP2 shards frozen and trained parameters alike, and trains what one process trains
    assert losses(lora_fsdp2) == pytest.approx(losses(lora_one), rel=1e-4)


def test_checkpoints_hold_the_adapter_and_its_optimizer_state(lora_ddp2):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    step, folder = layout.latest(lora_ddp2 / "checkpoints")
    assert step == STEPS
    meta = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    tensors = {k: m for k, m in meta.items() if isinstance(m, TensorStorageMetadata)}
    model = {k: m for k, m in tensors.items() if k.startswith("model.")}
    assert len(model) == 2 * 7 * 3 and all(".lora_A." in k or ".lora_B." in k for k in model), sorted(model)[:4]
    assert not [k for k in meta if k.startswith(("model.", "optim.")) and ".lora_" not in k]  # nothing of the base
    numel = lambda ms: sum(torch.Size(m.size).numel() for m in ms)  # noqa: E731
    assert numel(model.values()) == ADAPTER_PARAMS
    moments = [m for k, m in tensors.items() if k.endswith((".exp_avg", ".exp_avg_sq"))]
    assert numel(moments) == 2 * ADAPTER_PARAMS  # AdamW's two moments of each adapter tensor
    # the manifest still covers every data file, with its sha256
    sums = read_manifest(folder / "manifest.json", str(folder))
    assert set(sums) == {p.name for p in folder.glob("*.distcp")} | {".metadata"}
    for name, expected in sums.items():
        verify_file(folder / name, expected, str(folder))


def test_a_killed_rank_resumes_a_lora_run_exactly(train_dir, tiny_folder, chat_data, lora_one, lora_ddp2):
    # dropout acts (the 2-rank run with dropout is not the one-process run without it) ...
    assert losses(lora_ddp2) != pytest.approx(losses(lora_one), rel=1e-4)
    out = train_dir / "lora-crash"
    proc = run_train(
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        "--nproc",
        "2",
        "--checkpoint-every",
        "3",
        "--max-restarts",
        "2",
        *LORA,
        "--lora-dropout",
        "0.1",
        *COMMON,
        env={"SLUICE_TRAIN_FAULT": "kill:1:6"},
    )
    assert "resumed from step 3" in proc.stderr
    # ... and after the restart draws the masks of the uninterrupted run: the same floats
    assert losses(out) == losses(lora_ddp2)
    assert layout.complete_steps(out / "checkpoints") == [6, STEPS]


def _sluices_model(run: Path) -> torch.nn.Module:
    """The trained model as sluice holds it: the run's base with its adapter layers, restored from
    the newest checkpoint by the trainer's own Checkpointer, in eval mode (no dropout)."""
    from sluice.train.checkpoint.checkpointer import Checkpointer
    from sluice.train.model.build import build_model, trainable
    from sluice.train.settings import read_resolved

    built = build_model(read_resolved(run / "resolved_config.json"))
    assert (
        Checkpointer(run / "checkpoints", 2, False).restore(built.module, torch.optim.AdamW(trainable(built.module)))
        == STEPS
    )
    return built.module.eval()


def _logits(module: torch.nn.Module) -> torch.Tensor:
    tokens = torch.Generator().manual_seed(7)
    with torch.no_grad():
        return module(input_ids=torch.randint(0, VOCAB, (3, 24), generator=tokens)).logits


def test_the_export_is_a_peft_adapter_with_sluices_logits(tiny_folder, lora_ddp2, lora_export):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in lora_export.iterdir()}
    config = json.loads((lora_export / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["lora_dropout"]) == ("LORA", 4, 8, 0.1)
    assert sorted(config["target_modules"]) == sorted(t.module for t in LoraTarget)
    assert config["base_model_name_or_path"] == str(tiny_folder.resolve())  # the run's base
    weights = load_file(str(lora_export / "adapter_model.safetensors"))
    assert len(weights) == 2 * 7 * 3 and all(k.startswith("base_model.model.model.layers.") for k in weights)

    base = AutoModelForCausalLM.from_pretrained(str(tiny_folder), dtype=torch.float32).eval()
    before = _logits(base)
    peft = PeftModel.from_pretrained(base, str(lora_export)).eval()
    theirs, ours = _logits(peft), _logits(_sluices_model(lora_ddp2))
    assert (theirs - ours).abs().max().item() <= 1e-4
    assert (theirs - before).abs().max().item() > 1e-2, "the adapter changes the model"


def test_merge_writes_a_whole_model_equal_to_the_peft_model(train_dir, tiny_folder, lora_ddp2, lora_export):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = train_dir / "exports" / "lora-merged"
    proc = subprocess.run(
        train_cmd("export", str(lora_ddp2), "--out", str(out), "--merge"),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(an HF model folder, the LoRA adapter merged into its base)" in proc.stderr
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_folder), dtype=torch.float32).eval()
    peft = PeftModel.from_pretrained(base, str(lora_export)).eval()
    assert (_logits(merged) - _logits(peft)).abs().max().item() <= 1e-4


def test_another_base_is_refused_on_resume_and_merge(tmp_path, lora_one):
    run = tmp_path / "run"
    shutil.copytree(lora_one, run)
    record = run / "model" / "base.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "sha256": "0" * 64}))
    proc = subprocess.run(
        train_cmd("export", str(run), "--out", str(tmp_path / "m"), "--merge"),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 2 and "sluice: error: the base model" in proc.stderr, proc.stderr[-2000:]
    assert "differs from the one the run trained against" in proc.stderr
    resolved = json.loads((run / "resolved_config.json").read_text())
    args = ["--data", resolved["data"], "--out", str(run), "--model", resolved["model"], "--nproc", "1", *LORA, *COMMON]
    args[args.index("--max-steps") + 1] = str(STEPS + 2)
    with pytest.raises(TrainHaltError, match="differs from the one this run was started with"):
        run_in_process(*args)


def test_merge_of_a_full_fine_tuning_run_is_refused(tmp_path, capsys):
    from sluice.cli import main

    (tmp_path / "resolved_config.json").write_text(json.dumps({"lora_rank": None}))
    assert main(["train", "export", str(tmp_path), "--out", str(tmp_path / "m"), "--merge"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sluice: error: --merge applies to a LoRA run's adapter") and "Traceback" not in err


def test_activation_checkpointing_composes_with_lora(train_dir, tiny_folder, chat_data, lora_one):
    run = run_in_process(
        "--data",
        str(chat_data),
        "--out",
        str(train_dir / "lora-ac"),
        "--model",
        str(tiny_folder),
        "--nproc",
        "1",
        "--activation-checkpointing",
        *LORA,
        *COMMON,
    )
    assert losses(run) == pytest.approx(losses(lora_one), rel=1e-6)
