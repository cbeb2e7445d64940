"""Shared by the training benchmarks: a random Llama folder of a chosen size with a byte-level
tokenizer (no download; small vocabulary so the decoder layers, not the head, dominate), a
chat data file, and `sluice train run` with its per-step metrics."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ~0.7 M parameters: a step of 8 × 128 tokens takes a few hundred ms on one CPU core
SHAPE = dict(
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)


def write_model(path: Path, shape: dict = SHAPE, seed: int = 0) -> Path:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for ch in sorted(ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    config = transformers.LlamaConfig(
        **shape,
        vocab_size=len(vocab),
        eos_token_id=2,
        bos_token_id=1,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "bos_token": None, "add_bos_token": False})
    )
    return path


def write_data(path: Path, n: int = 400) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "system": "Answer in one sentence.",
                        "messages": [
                            {"role": "user", "content": f"What is {i} plus {i}, and is it even?"},
                            {
                                "role": "assistant",
                                "content": f"{i} plus {i} is {2 * i}, which is even like every double.",
                            },
                        ],
                    }
                )
                + "\n"
            )
    return path


def sluice_train(data: Path, out: Path, model: Path, *flags: str, env: dict | None = None) -> list[dict]:
    """`sluice train run` to completion; its metrics.jsonl lines."""
    cmd = [
        sys.executable,
        "-m",
        "sluice.cli",
        "train",
        "run",
        "--data",
        str(data),
        "--out",
        str(out),
        "--model",
        str(model),
        *flags,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode:
        raise SystemExit(f"sluice train run failed:\n{proc.stderr[-3000:]}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def steady(lines: list[dict], warmup: int) -> list[dict]:
    return lines[warmup:] or lines


def median(lines: list[dict], key: str) -> float:
    return statistics.median(x[key] for x in lines)


def sluice_in_process(*argv: str, cpu: list[float] | None = None) -> list[dict]:
    """`sluice train run ARGV` as a world of one inside this process: the launcher's checks and
    data preparation, then the very function every torchrun rank runs (no process start, so
    configurations can alternate in rounds under the same machine load). Its metrics lines;
    the CPU seconds of the training function (all threads) are appended to `cpu`."""
    import signal
    import time

    from sluice.cli import build_parser
    from sluice.cli.train import settings_from_args
    from sluice.train import launch, worker

    settings = settings_from_args(build_parser().parse_args(["train", "run", *argv]))
    launch.prepare(settings)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(launch.free_port()),
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
        }
    )
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    started = time.process_time()
    try:
        if worker.run(settings.run_dir) != 0:
            raise SystemExit("the training loop failed")
        if cpu is not None:
            cpu.append(time.process_time() - started)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    return [json.loads(x) for x in (settings.run_dir / "metrics.jsonl").read_text().splitlines()]


def write_sums_chat(path: Path, n: int = 200) -> Path:
    """n chat rows of "What is i plus i?" (the communication benchmarks' data: replica_sync.py,
    train_compression.py)."""
    with path.open("w") as f:
        for i in range(n):
            messages = [
                {"role": "user", "content": f"What is {i} plus {i}?"},
                {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")
    return path


def two_rank_run(data: Path, out: Path, model: str, steps: int, seq_len: str, *extra: str) -> list[dict]:
    """One 2-process `sluice train run` (global batch 8, lr 1e-3, one thread a rank) with `extra`
    flags; its metrics.jsonl lines. The communication benchmarks compare such runs."""
    cmd = [sys.executable, "-m", "sluice.cli", "train", "run", "--data", str(data), "--out", str(out)]
    cmd += ["--model", model, "--nproc", "2", "--max-steps", str(steps), "--seq-len", seq_len]
    cmd += ["--batch-size", "8", "--lr", "1e-3", "--threads", "1", *extra]
    subprocess.run(cmd, check=True, capture_output=True)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
