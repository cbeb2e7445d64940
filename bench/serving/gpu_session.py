#!/usr/bin/env python3
"""Everything issue 26 measures on a lent GPU machine, in one command of at most ~8 minutes.

Prepared on the CPU, not yet run on a GPU. The exact call of the device tool (its `run` verb),
from the repository root, after `bash bench/serving/gpu_wheels.sh` has put the missing wheels in .whl/:

    command:   PYTHONUNBUFFERED=1 python3 bench/serving/gpu_session.py --out $OUT
    carry:     [".whl"]
    timeout_s: 510

The machine's start (1-2 min) plus this call leave ~4 minutes of a 15-minute lease: enough for one
partial rerun while the machine is still warm (it goes back 30 s after a call), e.g.
`... bench/serving/gpu_session.py --out $OUT --parts bench-1b,graphs-1b --budget 200` with timeout_s 240;
read $OUT's summary.md first (the reply brings it back), then call give_back.

Parts, in priority order, each a child process with its own time box (and all of them inside
--budget seconds), so a crash, a hang or a CUDA fault in one leaves the others running:

  env           python / torch / CUDA / GPU name, nvidia-smi, which imports are missing
  floor         bench/kernels/copy_floor.py: copy bandwidth, weights' bytes per decode step, the floor
  tests         tests/unit/models/test_gpu.py: fp32 equality with transformers (tiny, small, 1b),
                bf16 within tolerance, paged attention GPU vs CPU, CUDA-graph decode steps
  graphs-small  bench/serving/decode_graphs.py: CUDA graphs on/off at 1 and 32 streams, launches per step
  bench-small   bench/serving/engine_throughput.py --random-init small, bf16: TTFT, per-stream and aggregate
                tok/s at 1/8/32/256 streams; transformers' generate (one at a time, static batch of
                256) as the anchor
  bench-1b      the same for the 1B shapes
  graphs-1b     CUDA graphs on/off for the 1B shapes

Everything lands under --out ($OUT), rewritten after every part so that a kill still leaves the
parts done: results.json (every part's JSON, exit code, seconds), summary.md (the tables, the
ratios, the issue's goals met or not), session.log (every part's output), tests.xml (JUnit).
Four files, inside the device tool's limits (8 files, two folders down).

--cpu-dry-run runs the same parts on the CPU at tiny sizes (the `tiny` shape, 1 and 8 streams,
16 tokens, the paged-attention tests only), to show the script executes end to end:

    PYTHONPATH=src python3 bench/serving/gpu_session.py --cpu-dry-run --out /tmp/gpu-dry
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_summary import summarize

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

ENV_SCRIPT = r"""
import importlib, json, platform, subprocess
info = {"python": platform.python_version()}
import torch
info.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=p.name, capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1),
                sms=p.multi_processor_count)
missing, versions = [], {}
for m in ("pydantic", "pydantic_settings", "tokenizers", "jinja2", "tqdm", "safetensors", "transformers",
          "numpy", "httpx", "hypothesis", "pytest", "pytest_timeout", "llguidance", "gguf"):
    try:
        versions[m] = getattr(importlib.import_module(m), "__version__", "?")
    except Exception as exc:
        missing.append(f"{m}: {type(exc).__name__}")
info.update(versions=versions, missing=missing)
try:
    import sluice.engine.engine, sluice.models.random_init  # noqa: F401
    info["sluice_imports"] = "ok"
except Exception as exc:
    info["sluice_imports"] = f"{type(exc).__name__}: {exc}"
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,"
                                         "clocks.max.sm,power.limit", "--format=csv"], capture_output=True,
                                        text=True, timeout=20).stdout
except Exception as exc:
    info["nvidia_smi"] = f"unavailable: {exc}"
print(json.dumps(info))
"""


Part = tuple[str, int, list[str], Path | None]  # name, time box (s), argv, JSON file it writes (None: stdout)


def _json_part(name: str, box: int, script: str, argv: list[str], tmp: Path) -> Part:
    """A bench script's part that writes its figures to tmp/NAME.json."""
    out = tmp / f"{name}.json"
    return (name, box, [PY, script, *argv, "--json-out", str(out)], out)


def parts(args: argparse.Namespace, tmp: Path, out: Path) -> list[Part]:
    """(name, time box in seconds, argv, JSON file the part writes or None for its last stdout line)."""
    dry = args.cpu_dry_run
    dev, dtype = ("cpu", "float32") if dry else ("cuda", "bfloat16")
    shapes = ["tiny"] if dry else ["small", "1b"]
    bench_common = ["--device", dev, "--dtype", dtype, "--runs", "1", "--skip-cache", "--threads", "1"]
    if dry:
        bench_common += "--batch 8 --out-tokens 16 --hf-requests 1 --set max_num_seqs=8 --set num_kv_blocks=256".split()
    else:  # 256 streams of ~100-token prompts + 128 tokens: 256 x 29 blocks of 8, well inside 16 GiB
        bench_common += (
            "--batch 256 --out-tokens 128 --hf-requests 2 --set max_num_seqs=256 "
            "--set max_num_batched_tokens=8192 --set kv_cache_gib=16"
        ).split()
    graphs_common = ["--device", dev, "--dtype", dtype] + (
        "--streams 1,8 --out-tokens 16 --reps 1 --profile-steps 2"
        if dry
        else "--streams 1,32 --out-tokens 64 --reps 2 --profile-steps 5"
    ).split()
    tests = [PY, "-m", "pytest", "tests/unit/models/test_gpu.py", "-q", "-rs", "-p", "no:cacheprovider"]
    tests += [f"--junitxml={out / 'tests.xml'}"] + (["-k", "paged_attention"] if dry else [])
    floor = [PY, "bench/kernels/copy_floor.py", "--device", dev, "--shapes", ",".join(shapes)]
    floor += ["--json-out", str(tmp / "floor.json")] + (["--mib", "64", "--reps", "3"] if dry else [])
    out_parts: list[Part] = [
        ("env", 60 if not dry else 120, [PY, "-c", ENV_SCRIPT], None),
        ("floor", 60 if not dry else 120, floor, tmp / "floor.json"),
        ("tests", 240 if not dry else 300, tests, None),
    ]
    first, second = shapes[0], shapes[-1]

    def graphs(shape: str, box: int) -> Part:
        return _json_part(
            f"graphs-{shape}", box, "bench/serving/decode_graphs.py", ["--random-init", shape, *graphs_common], tmp
        )

    out_parts.append(graphs(first, 100 if not dry else 300))
    for shape, box in ((first, 130), (second, 160)) if second != first else ((first, 300),):
        argv = ["--random-init", shape, *bench_common]
        out_parts.append(
            _json_part(f"bench-{shape}", box if not dry else 300, "bench/serving/engine_throughput.py", argv, tmp)
        )
    if second != first:
        out_parts.append(graphs(second, 100))
    return out_parts


def install_wheels(log) -> str | None:
    """pip-install the carried wheels (.whl/) into a scratch folder; its path, or None."""
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    if not wheels:
        log("no .whl/ folder: nothing to install (bash bench/serving/gpu_wheels.sh makes it)\n")
        return None
    site = Path(tempfile.gettempdir()) / "sluice-site"
    cmd = [
        PY,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--upgrade",
        "--target",
        str(site),
        *map(str, wheels),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    log(f"$ pip install {len(wheels)} wheels -> {site}: rc {r.returncode}\n{r.stdout}{r.stderr}\n")
    return str(site) if r.returncode == 0 else None


def run_part(argv: list[str], box: float, env: dict, log) -> tuple[int | None, float, str]:
    """Run one part in its own process group; kill the group past `box` seconds. (rc, s, output)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=box)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output += f"\n[gpu_session] killed after its {box:.0f} s time box\n"
        rc = None
    log(output)
    return rc, time.monotonic() - t0, output


def last_json_line(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu-session-out", help="results folder (default: $OUT)")
    p.add_argument(
        "--budget",
        type=float,
        default=450.0,
        help="seconds for all parts together (default: 450; the call's timeout_s leaves ~1 min more)",
    )
    p.add_argument("--parts", default="", help="comma-separated part names to run (default: all), e.g. for a rerun")
    p.add_argument("--cpu-dry-run", action="store_true", help="the same parts on the CPU at tiny sizes")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-session-"))
    deadline = time.monotonic() + args.budget
    log_file = open(out / "session.log", "a")

    def log(text: str) -> None:
        log_file.write(text)
        log_file.flush()

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    site = install_wheels(log)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT / "src"), str(ROOT), site, env.get("PYTHONPATH")) if x)
    results: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "dry_run": args.cpu_dry_run,
        "budget_s": args.budget,
        "parts": {},
    }
    wanted = {s.strip() for s in args.parts.split(",") if s.strip()}
    for name, box, cmd, json_file in parts(args, tmp, out):
        if wanted and name not in wanted:
            continue
        left = deadline - time.monotonic()
        if left < 10:
            results["parts"][name] = {"skipped": "the session's budget was spent"}
            print(f"[gpu_session] {name}: skipped (budget spent)", flush=True)
            continue
        limit = min(box, left)
        log(f"\n===== {name} (time box {limit:.0f} s): {' '.join(cmd[:6])} ...\n")
        rc, seconds, output = run_part(cmd, limit, env, log)
        result = None
        if json_file is not None and json_file.exists():
            result = json.loads(json_file.read_text())
        elif json_file is None:
            result = last_json_line(output) if name == "env" else None
        results["parts"][name] = {
            "rc": rc,
            "seconds": round(seconds, 1),
            "timed_out": rc is None,
            "result": result,
            "tail": output[-3000:],
        }
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "summary.md").write_text(summarize(results))
        status = "timed out" if rc is None else f"rc {rc}"
        print(f"[gpu_session] {name}: {status} in {seconds:.0f} s", flush=True)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    summary = summarize(results)
    (out / "summary.md").write_text(summary)
    print(summary, flush=True)
    failed = [n for n, r in results["parts"].items() if r.get("rc") not in (0, None) or r.get("timed_out")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
