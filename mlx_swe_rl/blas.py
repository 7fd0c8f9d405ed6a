"""Load an optimized BLAS before MLX on Linux.

The `mlx-cpu` wheel bundles the reference (netlib) BLAS, which runs a float32 matmul about
6-40x slower than OpenBLAS. MLX resolves its BLAS symbols when `mlx.core` is first imported,
so a library loaded into the global symbol namespace *before* that import wins. This module
is imported by the package's `__init__`, so any `import mlx_swe_rl...` does it early enough.
Set MLX_SWE_RL_NO_OPENBLAS=1 to keep the bundled BLAS, or OPENBLAS_CORETYPE to choose the
kernels yourself.
"""

from __future__ import annotations

import ctypes
import os
import sys

OPT_OUT_ENV = "MLX_SWE_RL_NO_OPENBLAS"
# The pthread build first: it is what `apt-get install libopenblas0-pthread` provides.
CANDIDATES = ("libopenblas.so.0", "libopenblas.so")

_loaded: str | None = None
_reason = "not tried"


def preload_openblas() -> str | None:
    """Load OpenBLAS with RTLD_GLOBAL if this is Linux, it is installed, the user has not
    opted out and MLX is not imported yet. Returns the library name loaded, or None."""
    global _loaded, _reason
    if _loaded is not None or _reason != "not tried":
        return _loaded
    if not sys.platform.startswith("linux"):
        _reason = "not Linux"
    elif os.environ.get(OPT_OUT_ENV, "") not in ("", "0"):
        _reason = f"disabled by {OPT_OUT_ENV}"
    elif "mlx.core" in sys.modules:
        _reason = "mlx was imported before mlx_swe_rl"
    else:
        _choose_core_type()
        for name in CANDIDATES:
            try:
                ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            _loaded, _reason = name, "loaded"
            return _loaded
        _reason = "not installed (Debian/Ubuntu: apt-get install libopenblas0-pthread)"
    return None


def _choose_core_type() -> None:
    """Tell OpenBLAS which kernels to use when the user has not.

    Older OpenBLAS builds (Debian 12 ships 0.3.21) do not recognise recent Xeons and fall back
    to SSE3 ("Prescott") kernels: measured here, a 1024^3 float32 matmul ran at 27 GFLOP/s that
    way and at 170 GFLOP/s with the AVX-512 kernels. The variable must be set before the
    library loads.
    """
    if os.environ.get("OPENBLAS_CORETYPE"):
        return
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    except OSError:
        return
    if "avx512f" in flags and "avx512bw" in flags and "avx512vl" in flags and "avx512dq" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
    elif "avx2" in flags and "fma" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "Haswell"


def blas_in_use() -> str:
    """A one-line description of the BLAS that MLX's CPU backend uses in this process."""
    if sys.platform == "darwin":
        return "Accelerate (macOS)"
    mapped = _mapped_libraries()
    # numpy/scipy wheels bundle OpenBLAS builds with prefixed symbols that MLX cannot use.
    openblas = sorted(p for p in mapped if "openblas" in os.path.basename(p)
                      and "numpy" not in p and "scipy" not in os.path.basename(p))
    if openblas:
        core = os.environ.get("OPENBLAS_CORETYPE")
        return f"OpenBLAS ({openblas[0]}{', kernels ' + core if core else ''})"
    bundled = sorted(p for p in mapped if os.path.basename(p).startswith("libblas"))
    where = f" ({bundled[0]})" if bundled else ""
    return f"reference BLAS bundled with MLX{where}; OpenBLAS {_reason}"


def _mapped_libraries() -> set[str]:
    try:
        with open("/proc/self/maps") as maps:
            return {line.split()[-1] for line in maps if ".so" in line}
    except OSError:
        return set()
