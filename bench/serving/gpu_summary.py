"""The markdown summary of bench/serving/gpu_session.py's results: tables, ratios, the issue's goals.

Every figure is looked up defensively: a part that failed or never ran leaves "-" in its cells
and a line saying so, never an exception (the summary is rewritten after every part).
"""

from __future__ import annotations

from typing import Any

# issue 26's goals for the bundled model's shapes on the H200
GOAL_TTFT_MS = 20.0
GOAL_X1_GRAPHS_TOK_S = 500.0
GOAL_X256_VS_HF = 3.0


def _get(d: Any, *keys: Any) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _f(v: Any, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _floor(results: dict, shape: str, dtype: str) -> float | None:
    return _get(results, "parts", "floor", "result", "floors", f"{shape}/{dtype}", "floor_ms_per_step")


def _share(floor_ms: float | None, tok_s: float | None) -> str:
    """The floor's share of a measured step: floor ms ÷ (1000 / per-stream tok/s)."""
    if floor_ms is None or not tok_s:
        return "-"
    return f"{100 * floor_ms * tok_s / 1000:.1f} %"


def _bench_table(results: dict, name: str) -> list[str]:
    r = _get(results, "parts", name, "result")
    if r is None:
        return [f"_{name}: no result ({_status(results, name)})_", ""]
    shape = name.split("-", 1)[1]
    dtype = _get(r, "args", "dtype") or "bfloat16"
    floor = _floor(results, shape, dtype)
    s = r.get("summary", {})
    lines = [
        f"**{r.get('model')}**, {dtype}, {_get(r, 'args', 'out_tokens')} output tokens per request, "
        f"weights {_f((r.get('weight_bytes') or 0) / 1e6, '.0f')} MB held; floor "
        f"{_f(floor, '.3f')} ms per decode step",
        "",
        "| phase | TTFT ms | per-stream tok/s | aggregate tok/s | ms per decode step | floor's share |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for phase in s:
        ps = _get(s, phase, "per_stream_tok_s", "median")
        lines.append(
            f"| {phase} | {_f(_get(s, phase, 'ttft_ms', 'median'))} | {_f(ps)} | "
            f"{_f(_get(s, phase, 'tok_s', 'median'))} | {_f(1000 / ps if ps else None, '.2f')} | "
            f"{_share(floor, ps)} |"
        )
    lines.append("")
    for k, v in (r.get("ratios") or {}).items():
        lines.append(f"- {k}: {_f(v.get('median'), '.2f')}")
    return lines + [""]


def _graphs_table(results: dict, name: str) -> list[str]:
    r = _get(results, "parts", name, "result")
    if r is None:
        return [f"_{name}: no result ({_status(results, name)})_", ""]
    floor = _floor(results, name.split("-", 1)[1], r.get("dtype", "bfloat16"))
    lines = [
        f"**{r.get('model')}**, {r.get('dtype')}, {r.get('out_tokens')} output tokens, buckets captured: "
        f"{r.get('buckets')}" + (f"; **capture failed**: {r['graph_failure']}" if r.get("graph_failure") else ""),
        "",
        "| streams | graphs | per-stream tok/s | TTFT ms | floor's share | host kernel launches / step | "
        "graph launches / step | GPU kernels / step |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ratios = []
    for k, level in (r.get("levels") or {}).items():
        for mode in ("on", "off"):
            m = level.get(mode, {})
            lp = m.get("launches_per_step", {})
            lines.append(
                f"| {k} | {mode} | {_f(m.get('per_stream_tok_s'))} | {_f(m.get('ttft_ms'))} | "
                f"{_share(floor, m.get('per_stream_tok_s'))} | {_f(lp.get('kernel_launch_calls'), '.0f')} | "
                f"{_f(lp.get('graph_launches'), '.0f')} | {_f(lp.get('gpu_kernels'), '.0f')} |"
            )
        ratios.append(
            f"- {k} stream(s): graphs / eager per-stream decode = {_f(level.get('graphs_vs_eager_per_stream'), '.2f')}x"
        )
    return lines + [""] + ratios + [""]


def _status(results: dict, name: str) -> str:
    p = _get(results, "parts", name)
    if p is None:
        return "not run"
    if "skipped" in p:
        return p["skipped"]
    return "timed out" if p.get("timed_out") else f"exit code {p.get('rc')}"


def _goals(results: dict) -> list[str]:
    x1_ttft = _get(results, "parts", "bench-small", "result", "summary", "sluice x1", "ttft_ms", "median")
    x1_graphs = _get(results, "parts", "graphs-small", "result", "levels", "1", "on", "per_stream_tok_s")
    vs_hf = _get(results, "parts", "bench-small", "result", "ratios", "sluice_xN_vs_hf_static_batch", "median")
    n = _get(results, "parts", "bench-small", "result", "args", "batch")

    def verdict(v: float | None, ok: bool) -> str:
        return "not measured" if v is None else ("**met**" if ok else "**not met**")

    return [
        "## Goals (the bundled model's shapes, bf16)",
        "",
        f"- TTFT at 1 stream < {GOAL_TTFT_MS:g} ms: {_f(x1_ttft)} ms, "
        f"{verdict(x1_ttft, x1_ttft is not None and x1_ttft < GOAL_TTFT_MS)}",
        f"- per-stream decode at 1 stream >= {GOAL_X1_GRAPHS_TOK_S:g} tok/s with graphs: {_f(x1_graphs)} tok/s, "
        f"{verdict(x1_graphs, x1_graphs is not None and x1_graphs >= GOAL_X1_GRAPHS_TOK_S)}",
        f"- aggregate at {n or 256} streams >= {GOAL_X256_VS_HF:g}x transformers' static batch: {_f(vs_hf, '.2f')}x, "
        f"{verdict(vs_hf, vs_hf is not None and vs_hf >= GOAL_X256_VS_HF and n == 256)}",
        "",
    ]


def summarize(results: dict) -> str:
    env = _get(results, "parts", "env", "result") or {}
    floor = _get(results, "parts", "floor", "result") or {}
    lines = [
        "# GPU session" + (" (CPU dry run: no figure here is a GPU's)" if results.get("dry_run") else ""),
        "",
        f"GPU: {env.get('gpu', '-')} (capability {env.get('capability', '-')}, {env.get('memory_gib', '-')} GiB), "
        f"torch {env.get('torch', '-')}, CUDA {env.get('cuda', '-')}, python {env.get('python', '-')}; "
        f"started {results.get('started')}",
        "",
    ]
    if env.get("missing"):
        lines += [f"Missing imports there: {', '.join(env['missing'])}", ""]
    lines += ["| part | status | seconds |", "| --- | --- | ---: |"]
    for name, p in results.get("parts", {}).items():
        lines.append(
            f"| {name} | {'ok' if p.get('rc') == 0 else _status(results, name)} | {_f(p.get('seconds'), '.0f')} |"
        )
    lines.append("")
    copy = floor.get("copy") or {}
    lines += [
        "## The floor",
        "",
        f"Device-to-device copy: {_f(copy.get('gb_s'), '.0f')} GB/s (read + write; best "
        f"{_f(copy.get('gb_s_best'), '.0f')}), over a {copy.get('buffer_mib', '-')} MiB buffer.",
        "",
    ]
    for k, f in (floor.get("floors") or {}).items():
        lines.append(
            f"- {k}: {f['weight_bytes'] / 1e6:.1f} MB of weights per decode step, floor "
            f"{f['floor_ms_per_step']:.4f} ms/step ({f['floor_tok_s_per_stream']:.0f} tok/s per stream at batch 1)"
        )
    lines.append("")
    tests = _get(results, "parts", "tests")
    if tests:
        tail = [ln for ln in tests.get("tail", "").splitlines() if ln.strip()]
        lines += ["## Tests (tests/unit/models/test_gpu.py)", "", "```", *(tail[-12:]), "```", ""]
    lines += ["## Engine throughput", ""]
    for name in results.get("parts", {}):
        if name.startswith("bench-"):
            lines += _bench_table(results, name)
    lines += ["## CUDA graphs for decode steps", ""]
    for name in results.get("parts", {}):
        if name.startswith("graphs-"):
            lines += _graphs_table(results, name)
    if not results.get("dry_run"):
        lines += _goals(results)
    return "\n".join(lines) + "\n"
