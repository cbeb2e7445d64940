"""Build the C++ kernels against the installed torch, once per source version, into a cache.

No build isolation and no wheel: a pip build backend would pull torch into an isolated
environment (a multi-GB CUDA download). Instead the extension is compiled just in time:

* the per-ISA kernel files (csrc/isa_*.cpp) are compiled here with plain `c++`, each with its
  own -m flags (AVX2+FMA+F16C; AVX-512 F/BW/DQ/VL; the same plus VNNI): the flags never leak
  into code that runs before the CPU has been checked;
* the torch glue (csrc/ops.cpp) is compiled and linked with them by
  torch.utils.cpp_extension.load (ninja from PyPI), which chooses the ISA at run time (cpuid).

The cache directory is keyed by a hash of the sources, the flags, the compiler and the torch
and Python versions, so an edit or an upgrade builds anew and a stale build is never loaded.
`make install` runs this module once; otherwise the first use builds (~1 minute on 2 cores).

    python -m sluice.models.kernels.build      # build (if needed) and print the ISA in use
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

CSRC = Path(__file__).parent / "csrc"
COMMON_FLAGS = [
    "-O3",
    "-fPIC",
    "-std=c++17",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-Wall",
    "-Wno-maybe-uninitialized",
]
# -ffp-contract=off everywhere: the kernels' exactness depends on every multiply and add being
# rounded where the source says (kernels_impl.h), never fused by the compiler.
# -fopenmp on the glue: at::parallel_for is a header template that runs its body on the calling
# thread alone unless the including translation unit is compiled with OpenMP (ATen's
# INTRA_OP_PARALLEL comes from _OPENMP). Without it every kernel ran on one thread while oneDNN
# used all of torch's; prefill, which is compute-bound, then took ~2x as long on 2 cores.
# The OpenMP runtime is torch's own (libgomp.so.1, already loaded when the extension is), so
# the kernels share torch's thread pool and its torch.set_num_threads() setting.
GLUE_FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp"]
GLUE_LDFLAGS = ["-fopenmp"]


@dataclass(frozen=True, slots=True)
class IsaObject:
    source: str
    name: str
    flags: tuple[str, ...]


ISA_OBJECTS = (
    IsaObject("isa_avx2.cpp", "isa_avx2", ("-mavx2", "-mfma", "-mf16c")),
    IsaObject(
        "isa_avx512.cpp",
        "isa_avx512",
        ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"),
    ),
    IsaObject(
        "isa_avx512.cpp",
        "isa_avx512vnni",
        ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512vnni"),
    ),
)


def compiler() -> str:
    return os.environ.get("CXX", "c++")


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"no C++ compiler ({cxx}): {exc}") from None


def source_key(cxx: str | None = None) -> str:
    import torch

    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    for obj in ISA_OBJECTS:
        h.update(repr(obj).encode())
    h.update(
        repr(
            (COMMON_FLAGS, GLUE_FLAGS, GLUE_LDFLAGS, torch.__version__, sys.version, sysconfig.get_platform())
        ).encode()
    )
    h.update(_compiler_version(cxx or compiler()).encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    explicit = os.environ.get("SLUICE_KERNEL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "sluice" / "kernels"


def module_name(key: str) -> str:
    return f"sluice_kernels_{key}"


def _ninja_on_path() -> None:
    # cpp_extension runs `ninja` from PATH; the PyPI package puts it next to the interpreter,
    # which is not on PATH when the venv is not activated.
    try:
        import ninja

        bin_dir = ninja.BIN_DIR
    except (ImportError, AttributeError):
        bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def _compile_isa_objects(out: Path, cxx: str, verbose: bool) -> list[Path]:
    procs = []
    for obj in ISA_OBJECTS:
        target = out / f"{obj.name}.o"
        cmd = [cxx, *COMMON_FLAGS, *obj.flags, "-c", str(CSRC / obj.source), "-o", str(target)]
        if verbose:
            print(" ".join(cmd), file=sys.stderr)
        procs.append((target, cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    objects = []
    for target, cmd, proc in procs:
        output, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {target.name} failed:\n{' '.join(cmd)}\n{output[-4000:]}")
        objects.append(target)
    return objects


def build(verbose: bool = False) -> Path:
    """Build (unless the cache already holds this version) and return the extension's path."""
    cxx = compiler()
    key = source_key(cxx)
    out = cache_root() / key
    so = out / f"{module_name(key)}.so"
    if so.exists():
        return so
    out.mkdir(parents=True, exist_ok=True)
    # one builder at a time (a server and its worker, or parallel test processes)
    with open(out / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if so.exists():
            return so
        objects = _compile_isa_objects(out, cxx, verbose)
        # cpp_extension guards its build directory with a `lock` file and waits forever while
        # one exists; a build killed half-way leaves it behind. We hold build.lock, so no other
        # builder is inside: a `lock` file here is stale.
        (out / "lock").unlink(missing_ok=True)
        _ninja_on_path()
        from torch.utils.cpp_extension import load

        load(
            name=module_name(key),
            sources=[str(CSRC / "ops.cpp")],
            extra_cflags=GLUE_FLAGS,
            extra_ldflags=[str(o) for o in objects] + GLUE_LDFLAGS,
            extra_include_paths=[str(CSRC)],
            build_directory=str(out),
            verbose=verbose,
        )
    return so


def load_module(verbose: bool = False) -> ModuleType:
    """Import the built extension (building it first if needed)."""
    import torch  # noqa: F401  (the extension links against libtorch, which must be loaded first)

    so = build(verbose)
    name = so.stem
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, str(so))
    spec = importlib.util.spec_from_file_location(name, str(so), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


def main() -> int:
    try:
        mod = load_module(verbose="-v" in sys.argv)
    except Exception as exc:  # reported, not fatal: sluice then runs its torch path
        print(f"sluice kernels: not built ({exc}); sluice will use its torch path", file=sys.stderr)
        return 1
    available = ", ".join(mod.available_isas()) or "none"
    print(f"sluice kernels: built in {cache_root()}; ISA in use: {mod.isa()} (available: {available})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
