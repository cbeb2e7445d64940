#!/usr/bin/env python3
"""The paged decode attention kernel alone, before vs after a change, and the memory floor.

Compiles the AVX2 kernels of two checkouts (`--before DIR`, and this one) each into its own
namespace, links them with bench/kernels/csrc/decode_attention_micro.cpp, and runs it: one sequence of
the bundled model's attention shape (9 query heads, 3 KV heads, head dim 64, block 8), both
kernels and a plain read of the same K/V rows interleaved in one process, timed in the thread's
CPU time (p25 and median over 15 rounds, µs per layer). Cases: long context from memory
(30 layers' caches, blocks contiguous and scattered), long context in L3 (one layer), one chunk
in L2. Needs a C++ compiler with AVX2; no torch. Ends with one JSON line.

    git worktree add /tmp/sluice-before <commit>
    .venv/bin/python bench/kernels/decode_attention_micro.py --before /tmp/sluice-before
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CSRC = Path("src/sluice/models/kernels/csrc")
FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-math-errno", "-mavx2", "-mfma", "-mf16c"]
# --isa avx512: the AVX-512 build of the kernels (simd_avx512.h), as the extension uses where the CPU has it
ISA_FLAGS = {
    "avx2": ([], "simd_avx2.h"),
    "avx512": (["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"], "simd_avx512.h"),
}
# (name, context, repetitions, layers, scatter)
CASES = [
    ("memory_contiguous", 1368, 4, 30, 1),
    ("memory_scattered", 1368, 4, 30, 4),
    ("l3", 1368, 50, 1, 1),
    ("l2", 128, 500, 1, 1),
    # a 32-stream decode step's attention: 32 sequences x 30 layers of ~128 context tokens, each
    # its own cache, blocks spread at random (as 32 requests allocating side by side leave them)
    ("batch32_scattered", 128, 2, 960, 4),
]


def _side(tmp: Path, name: str, checkout: Path, isa: str) -> Path:
    tu = tmp / f"{name}.cpp"
    tu.write_text(
        f'#define SLUICE_ISA_NS ns_{name}\n#define SLUICE_ISA_NAME "{name}"\n#include "{ISA_FLAGS[isa][1]}"\n'
        f'#include "kernels_impl.h"\nnamespace sluice {{ const KernelTable* table_{name}() '
        f"{{ return &ns_{name}::kTable; }} }}\n"
    )
    obj = tmp / f"{name}.o"
    subprocess.run(
        ["c++", *FLAGS, *ISA_FLAGS[isa][0], "-I", str(checkout / CSRC), "-c", str(tu), "-o", str(obj)], check=True
    )
    return obj


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="a checkout of the commit to compare against")
    p.add_argument("--isa", choices=sorted(ISA_FLAGS), default="avx2", help="the kernels' build (default avx2)")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        objs = [_side(tmp, "before", args.before.resolve(), args.isa), _side(tmp, "after", HERE.parents[1], args.isa)]
        exe = tmp / "micro"
        subprocess.run(
            [
                "c++",
                *FLAGS,
                "-I",
                str(HERE.parents[1] / CSRC),
                str(HERE / "csrc" / "decode_attention_micro.cpp"),
                *map(str, objs),
                "-o",
                str(exe),
            ],
            check=True,
        )
        result: dict = {}
        print(
            f"{'case':>18} {'before':>8} {'after':>8} {'read':>8} {'after/before':>12}  (us per layer, p25)",
            file=sys.stderr,
        )
        for name, ctx, reps, layers, scatter in CASES:
            if args.cases and name not in args.cases.split(","):
                continue
            out = subprocess.run(
                [str(exe), str(ctx), str(reps), str(layers), str(scatter)], check=True, capture_output=True, text=True
            ).stdout
            fig = json.loads(out)
            result[name] = fig
            b, a, r = fig["before_us_p25"], fig["after_us_p25"], fig["read_us_p25"]
            print(f"{name:>18} {b:8.1f} {a:8.1f} {r:8.1f} {a / b:12.3f}", file=sys.stderr)
    result["load_average"] = os.getloadavg()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
