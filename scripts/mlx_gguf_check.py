"""How MLX's own GGUF reader (`mx.load`) decodes a file, tensor type by tensor type, against
llama.cpp's reference (the `gguf` package): the measurement behind the importer's refusal to
trust it (mlx_swe_rl/models/gguf.py). Writes the largest error per type, and the models' sanity
figures, as JSON.

    python scripts/mlx_gguf_check.py FILE.gguf [FILE.gguf ...] --out docs/results/gguf-decoders.json
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import click
import numpy as np

import mlx_swe_rl  # noqa: F401  (OpenBLAS before mlx.core)
import mlx.core as mx
from mlx_swe_rl.models.gguf import read_gguf, reference_dequantize


def mlx_errors(path: Path) -> dict:
    """Per GGML type: tensors, the largest |mx.load - reference| and the mean |w|; or MLX's error."""
    file = read_gguf(path)
    try:
        weights = mx.load(str(path))
    except Exception as exc:  # noqa: BLE001 - what MLX says is the finding
        return {"mx.load": f"fails: {exc}"}
    found: dict[str, dict] = defaultdict(lambda: {"tensors": 0, "max_error": 0.0, "mean_abs": []})
    for name, info in file.tensors.items():
        raw = file.raw(info)
        ref = reference_dequantize(raw, info.type).reshape(info.shape)
        if name.endswith(".weight") and f"{name[:-7]}.scales" in weights:
            stem = name[:-7]
            bits = weights[name].shape[-1] * 32 // (weights[f"{stem}.scales"].shape[-1] * 32)
            got = mx.dequantize(weights[name], weights[f"{stem}.scales"].astype(mx.float32),
                                weights[f"{stem}.biases"].astype(mx.float32), group_size=32, bits=bits)
        else:
            got = weights[name].astype(mx.float32)
        entry = found[info.type_name()]
        entry["tensors"] += 1
        entry["max_error"] = max(entry["max_error"], float(np.abs(np.array(got).reshape(ref.shape) - ref).max()))
        entry["mean_abs"].append(float(np.abs(ref).mean()))
    return {t: {"tensors": e["tensors"], "max_error": round(e["max_error"], 6),
                "mean_abs_weight": round(float(np.mean(e["mean_abs"])), 6)} for t, e in sorted(found.items())}


@click.command()
@click.argument("files", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True)
def main(files: tuple[Path, ...], out: Path) -> None:
    result = {}
    for path in files:
        md = read_gguf(path, tensors=False).metadata
        result[md.get("general.name", path.name)] = {"file": path.name, "mlx_vs_reference": mlx_errors(path)}
        click.echo(f"{path.name}: {json.dumps(result[md.get('general.name', path.name)])}")
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
