"""What every benchmark shares: the machine line, the machine's measured ceilings (the
roofline the floors are computed from), FLOP and byte counts for a model, and result output.

A floor is the time the work would take at the machine's ceiling: max(FLOPs / peak FLOP/s,
bytes / memory bandwidth). The ceilings are measured here, on the same process and dtype, not
taken from a data sheet, so "x times the floor" compares like with like.
"""

from __future__ import annotations

from mlx_swe_rl.blas import blas_in_use  # first: importing the package loads OpenBLAS before MLX

import json
import os
import platform
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import mlx.core as mx
from mlx.utils import tree_flatten

from mlx_swe_rl.models import fastmath


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The facts a reader needs to compare two result files."""
    return {"mlx": mx.__version__, "device": str(mx.default_device()), "blas": blas_in_use(),
            "cpu": cpu_model(), "cores": os.cpu_count(), "platform": f"{platform.system()} {platform.machine()}",
            "fast_math": fastmath.installed()}


def machine_line(info: dict[str, Any]) -> str:
    return (f"machine: {info['cpu']} ({info['cores']} cores), MLX {info['mlx']} on {info['device']}, "
            f"BLAS {info['blas']}, fast math {'on' if info['fast_math'] else 'off'}")


def _best_seconds(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@dataclass
class Ceilings:
    """Measured peaks: float32 GEMM FLOP/s, and the rate a batch-of-8 matmul streams its weights
    (the bound on decoding, which reads every weight once per step)."""

    gflops: float
    bandwidth_gbs: float

    def floor_seconds(self, flops: float, bytes_moved: float) -> float:
        return max(flops / (self.gflops * 1e9), bytes_moved / (self.bandwidth_gbs * 1e9))


def measure_ceilings() -> Ceilings:
    """Best of a few 2048^3 float32 matmuls, and of [8, 4096] x [4096, 16384] (256 MB of weights)."""
    a, b = mx.random.normal((2048, 2048)), mx.random.normal((2048, 2048))
    x, w = mx.random.normal((8, 4096)), mx.random.normal((4096, 16384))
    mx.eval(a, b, x, w)
    gemm = _best_seconds(lambda: mx.eval(a @ b))
    stream = _best_seconds(lambda: mx.eval(x @ w), repeats=3)
    return Ceilings(gflops=2 * 2048**3 / gemm / 1e9, bandwidth_gbs=w.nbytes / stream / 1e9)


@dataclass
class ModelCounts:
    """Parameter counts of a causal LM, split the way the FLOP counts need them."""

    body: int  # transformer blocks (the matmuls every token goes through)
    head: int  # output projection (applied only where logits are needed)
    total_bytes: int  # every weight, as stored
    kv_bytes_per_token: int = 0  # keys and values of one token in every layer, in the weights' dtype

    def forward_flops(self, body_tokens: int, head_tokens: int) -> float:
        """2 FLOPs per weight per token (attention's own L x S products are left out: they are
        a few per cent at these lengths, so the floor stays a true lower bound)."""
        return 2.0 * (self.body * body_tokens + self.head * head_tokens)


def model_counts(model: Any) -> ModelCounts:
    params = dict(tree_flatten(model.parameters()))
    body = sum(v.size for k, v in params.items() if ".layers." in k and not k.endswith(("scales", "biases")))
    if "lm_head.weight" in params:
        head = params["lm_head.weight"].size
    else:
        head = params["model.embed_tokens.weight"].size
    args = getattr(model, "args", None)
    kv = 0
    if args is not None and hasattr(args, "num_key_value_heads"):
        head_dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
        itemsize = next(v for k, v in params.items() if k.endswith("norm.weight")).itemsize  # activations' dtype
        kv = 2 * args.num_hidden_layers * args.num_key_value_heads * head_dim * itemsize
    return ModelCounts(body=body, head=head, total_bytes=sum(v.nbytes for v in params.values()), kv_bytes_per_token=kv)


def print_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]], echo=print) -> None:
    """rows of dicts; columns (key, header, format spec). Missing cells print as '-'."""
    def cell(row: dict[str, Any], key: str, fmt: str) -> str:
        value = row.get(key)
        return "-" if value is None else format(value, fmt)

    table = [[header for _, header, _ in columns]] + [[cell(r, k, f) for k, _, f in columns] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        echo("  ".join(text.ljust(w) if i == 0 else text.rjust(w) for i, (text, w) in enumerate(zip(line, widths))))


def peak_memory() -> dict[str, float]:
    """This process's peak resident set size (what peers such as TRL report) next to MLX's
    allocator peak (MLX buffers only: no Python, no tokenizer, no freed-but-cached pages)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024  # Linux counts KiB, macOS bytes
    return {"process_peak_rss_gb": rss_bytes / 1e9, "mlx_peak_gb": mx.get_peak_memory() / 1e9}


def warn_below_floor(measured: Iterable[tuple[str, float, float | None]], echo: Callable[[str], None] = print) -> int:
    """Print a warning for each (what, seconds, floor seconds) measured faster than its floor:
    the floor is a lower bound, so that means the ceilings were measured on a disturbed
    machine (or the work count is wrong), and every "x floor" of the run is suspect."""
    below = [(what, seconds, floor) for what, seconds, floor in measured if floor and seconds < floor]
    for what, seconds, floor in below:
        echo(f"WARNING: {what} took {seconds:.4g} s, below its floor of {floor:.4g} s: the ceilings "
             "were measured on a busy machine; rerun on an idle one before trusting these figures")
    return len(below)


def write_result(out: Path, payload: dict[str, Any], echo: Callable[[str], None] = print) -> None:
    """Write a benchmark's JSON, with the process's memory peaks added (and printed)."""
    memory = peak_memory()
    echo(f"memory: process peak RSS {memory['process_peak_rss_gb']:.2f} GB, "
         f"MLX peak {memory['mlx_peak_gb']:.2f} GB")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**payload, "memory": memory}, indent=1,
                              default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o)))
