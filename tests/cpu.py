"""What the test machine's CPU offers (the kernels need AVX2 + FMA + F16C)."""

from __future__ import annotations


def has_avx2() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return all(f" {f}" in flags for f in ("avx2", "fma", "f16c"))
