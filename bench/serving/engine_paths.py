"""`engine_throughput.py --paths`: sluice's compute paths side by side in one run.

Three engines on the same bundled model and the same workload, stepped in turn (one step()
each, the lead swapping every round), so a burst of other work on the shared machine lands on
all of them alike:

  torch    the portable path: fp32 weights dequantized at load, oneDNN linears, torch ops,
           decode attention on a gathered copy of the K/V (sluice before the kernels)
  kernels  the CPU kernels, exact numerics (the default): weights in their GGUF blocks
  fast     the same kernels with numerics = fast (int8 activations x 4-bit weights)

Figures per concurrency level (1, 8 and N streams, 128 output tokens each):
  decode step ms   median over the steps where every running request decodes (no prefill)
  per-stream tok/s 1000 / decode step ms;  aggregate decode tok/s = streams x that
  attention %      median over decode steps of (time in the attention backend / step time)
  ratio            median over paired decode steps of (torch step time / this engine's)
  CPU ms, CPU x    the same from this process's CPU time per step: with --threads 1 it counts the
                   work of a step and not the time other processes held the cores
Then one request at a time at long prompts (~380 and ~1,370 tokens): TTFT (submit -> first
token) and the decode step at that context, alternating engines request by request. Memory:
each path loads the model in a fresh process; resident memory after the load, less before it.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

ENGINES = ("torch", "kernels", "fast")


class AttentionTimer:
    """Wraps a model's attention backend; `take()` returns the seconds spent since the last take."""

    def __init__(self, model) -> None:
        self.spent = 0.0
        backend = model.attention
        for name in ("forward", "attend"):
            setattr(backend, name, self._wrap(getattr(backend, name)))

    def _wrap(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent += time.perf_counter() - t

        return timed

    def take(self) -> float:
        spent, self.spent = self.spent, 0.0
        return spent


@dataclasses.dataclass
class Trace:
    steps: list[float] = dataclasses.field(default_factory=list)  # decode-only steps, wall
    cpu: list[float] = dataclasses.field(default_factory=list)  # the same steps, process CPU time
    attention: list[float] = dataclasses.field(default_factory=list)  # share of each decode step
    busy: float = 0.0
    tokens: int = 0
    first_token: float | None = None  # this engine's busy time until its first token (TTFT)
    first_token_cpu: float | None = None  # and the CPU time it took
    cpu_total: float = 0.0


def interleaved(engines: dict, timers: dict, ids: list[list[int]], out_tokens: int, submit) -> dict[str, Trace]:
    traces = {k: Trace() for k in engines}
    for k, e in engines.items():
        start = time.perf_counter()
        submit(e, ids, out_tokens)
        traces[k].busy += time.perf_counter() - start
    names, rnd = list(engines), 0
    while any(e.has_unfinished() for e in engines.values()):
        for k in names if rnd % 2 == 0 else names[::-1]:
            e, tr = engines[k], traces[k]
            if not e.has_unfinished():
                continue
            timers[k].take()
            c, t = time.process_time(), time.perf_counter()
            events = e.step()
            dt, dc = time.perf_counter() - t, time.process_time() - c
            attn = timers[k].take()
            tr.busy += dt
            tr.cpu_total += dc
            n = sum(len(ev.token_ids) for ev in events)
            tr.tokens += n
            if n and tr.first_token is None:  # busy time only: the other engines' steps ran in between
                tr.first_token, tr.first_token_cpu = tr.busy, tr.cpu_total
            s = e.stats()
            if s.last_step_tokens == s.last_step_seqs == len(ids):  # every request decodes
                tr.steps.append(dt)
                tr.cpu.append(dc)
                tr.attention.append(attn / dt)
        rnd += 1
    return traces


def paired(a: list[float], b: list[float]) -> float | None:
    n = min(len(a), len(b))
    return statistics.median(x / y for x, y in zip(a[:n], b[:n])) if n else None


def long_prompt(tokenizer, words: int) -> list[int]:
    text = " ".join(f"Item {i}: the river bends past the mill and the old bridge." for i in range(words // 11 + 1))
    return tokenizer.encode_chat([{"role": "user", "content": f"Summarize this list. {text}"}])


def rss_after_load(kernels: str) -> dict:
    """Resident memory of a fresh process after loading the model (weights + code), in MB."""
    code = (
        "import json, torch\n"
        "def rss():\n"
        "    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) / 1024\n"
        "before = rss()\n"
        "from sluice.models.loader import load_model\n"
        f"m = load_model(progress=False, kernels={kernels!r})\n"
        "print(json.dumps({'rss_before_mb': before, 'rss_after_mb': rss(), 'weight_mb': m.model.weight_bytes() / 2**20,"
        " 'kernels': m.model.uses_kernels}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return {"error": out.stderr[-500:]}
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["resident_weights_mb"] = r["rss_after_mb"] - r["rss_before_mb"]
    return r


def _long_prompt(engines: dict, timers: dict, p: list[int], submit) -> dict[str, dict[str, float]]:
    """One long prompt and 32 tokens on each engine, one after another (TTFT is a single long
    step sequence): per engine its figures, and its ratios to the torch path."""
    res = {}
    for name in ENGINES:
        t = interleaved({name: engines[name]}, {name: timers[name]}, [p], 32, submit)[name]
        assert t.first_token is not None and t.first_token_cpu is not None  # 32 tokens came
        res[name] = {
            "ttft_ms": 1000 * t.first_token,
            "decode_step_ms": 1000 * statistics.median(t.steps),
            "decode_cpu_ms": 1000 * statistics.median(t.cpu),
            "ttft_cpu_ms": 1000 * t.first_token_cpu,
            "attention_share": statistics.median(t.attention),
            "prompt_tokens": len(p),
        }
    for name in ENGINES:
        res[name]["ttft_vs_torch"] = res["torch"]["ttft_ms"] / res[name]["ttft_ms"]
        res[name]["ttft_cpu_vs_torch"] = res["torch"]["ttft_cpu_ms"] / res[name]["ttft_cpu_ms"]
        res[name]["decode_vs_torch"] = res["torch"]["decode_step_ms"] / res[name]["decode_step_ms"]
        res[name]["cpu_speedup_vs_torch"] = res["torch"]["decode_cpu_ms"] / res[name]["decode_cpu_ms"]
    return res


def run_paths(args, log, prompts, submit) -> dict:
    """Returns the JSON record; logs the table."""
    import torch

    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model

    torch.set_num_threads(args.threads)
    log("loading the model on both paths ...")
    on_torch = load_model(progress=False, kernels="torch")
    on_kernels = load_model(progress=False, kernels="auto")
    if not on_kernels.model.uses_kernels:
        raise SystemExit("the kernels are unavailable on this machine (see the log); nothing to compare")
    cfg = EngineConfig(**args.config)
    engines = {
        "torch": LLMEngine(on_torch, cfg),
        "kernels": LLMEngine(on_kernels, cfg),
        "fast": LLMEngine(on_kernels, dataclasses.replace(cfg, numerics="fast")),
    }
    kernel_timer = AttentionTimer(on_kernels.model)  # "kernels" and "fast" share the model
    timers = {"torch": AttentionTimer(on_torch.model), "kernels": kernel_timer, "fast": kernel_timer}
    ids = prompts(on_kernels.tokenizer, args.batch)
    for e in engines.values():  # warm-up
        submit(e, ids[:2], 8)
        while e.has_unfinished():
            e.step()
    levels = sorted({1, min(8, args.batch), args.batch})
    runs: list[dict] = []
    for run in range(args.runs):
        record: dict = {}
        for k in levels:
            log(f"run {run + 1}/{args.runs}: {k} stream(s), {args.out_tokens} tokens each, engines in turn")
            traces = interleaved(engines, timers, ids[:k], args.out_tokens, submit)
            record[f"x{k}"] = {
                name: {
                    "decode_step_ms": 1000 * statistics.median(t.steps) if t.steps else None,
                    "decode_cpu_ms": 1000 * statistics.median(t.cpu) if t.cpu else None,
                    "cpu_speedup_vs_torch": paired(traces["torch"].cpu, t.cpu),
                    "aggregate_tok_s": t.tokens / t.busy,
                    "attention_share": statistics.median(t.attention) if t.attention else None,
                    "ttft_ms": 1000 * t.first_token if t.first_token else None,
                    "speedup_vs_torch": paired(traces["torch"].steps, t.steps),
                    "decode_steps": len(t.steps),
                }
                for name, t in traces.items()
            }
        for words in (300, 1150):
            p = long_prompt(on_kernels.tokenizer, words)
            log(f"run {run + 1}/{args.runs}: one {len(p)}-token prompt, 32 tokens, engines in turn")
            record[f"prompt{len(p)}"] = _long_prompt(engines, timers, p, submit)
        runs.append(record)
    log("resident memory of the weights (fresh process per path) ...")
    memory = {"torch": rss_after_load("torch"), "kernels": rss_after_load("auto")}
    summary = _summarize(runs)
    _print(summary, memory, log, args)
    kernel_ops = on_kernels.model.ops
    assert kernel_ops is not None  # loaded with kernels="auto": the run above used them
    return {
        "bench": "engine_paths",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "isa": kernel_ops.isa(),
        "summary": summary,
        "memory": memory,
        "runs": runs,
    }


def _summarize(runs: list[dict]) -> dict:
    out: dict = {}
    for phase in runs[0]:
        out[phase] = {}
        for name in runs[0][phase]:
            out[phase][name] = {}
            for key in runs[0][phase][name]:
                vals = [r[phase][name][key] for r in runs if isinstance(r[phase][name].get(key), (int, float))]
                if vals:
                    out[phase][name][key] = statistics.median(vals)
    return out


def _print(summary: dict, memory: dict, log, args) -> None:
    log()
    log(
        f"paths side by side: {args.out_tokens} tokens/request, {args.threads} threads, {args.runs} run(s), "
        "medians over runs"
    )
    head = (
        f"{'phase':<12}{'engine':<9}{'decode ms':>10}{'stream tok/s':>14}{'agg tok/s':>11}{'attn %':>8}"
        f"{'x torch':>9}{'CPU ms':>8}{'CPU x':>7}{'TTFT ms':>9}"
    )
    log(head)
    log("-" * len(head))
    for phase, engines in summary.items():
        for name, v in engines.items():
            step = v.get("decode_step_ms")
            streams = int(phase[1:]) if phase.startswith("x") else 1
            ratio = v.get("speedup_vs_torch") or v.get("decode_vs_torch")
            log(
                f"{phase:<12}{name:<9}{step or 0:10.2f}{1000 / step if step else 0:14.1f}"
                f"{streams * 1000 / step if step else 0:11.1f}{100 * v.get('attention_share', 0):8.1f}"
                f"{ratio or 0:9.2f}{v.get('decode_cpu_ms') or 0:8.1f}{v.get('cpu_speedup_vs_torch') or 0:7.2f}"
                f"{v.get('ttft_ms') or 0:9.0f}"
            )
        log()
    for name, m in memory.items():
        if "error" in m:
            log(f"memory {name}: failed: {m['error']}")
        else:
            log(
                f"memory {name:<8} weights {m['weight_mb']:7.1f} MB, "
                f"resident after load +{m['resident_weights_mb']:7.1f} MB"
            )
