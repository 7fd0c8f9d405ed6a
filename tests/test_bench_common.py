"""The benchmark helpers every figure goes through: memory peaks and the below-floor warning."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from common import peak_memory, warn_below_floor, write_result  # noqa: E402  (loads OpenBLAS before MLX)

import mlx.core as mx  # noqa: E402


def test_warns_only_for_phases_faster_than_their_floor():
    lines: list[str] = []
    count = warn_below_floor([("sampling", 2.0, 1.0), ("update", 0.5, 0.8), ("scoring", 0.1, None)], lines.append)
    assert count == 1 and len(lines) == 1
    assert lines[0].startswith("WARNING: update took 0.5 s, below its floor of 0.8 s")


def test_peak_rss_counts_this_process(tmp_path):
    before = peak_memory()["process_peak_rss_gb"]
    block = mx.ones((64, 1024, 1024))  # 256 MB, touched
    mx.eval(block.sum())
    memory = peak_memory()
    assert memory["mlx_peak_gb"] >= 0.25
    assert memory["process_peak_rss_gb"] >= max(before, 0.25)
    lines: list[str] = []
    write_result(tmp_path / "r.json", {"x": 1}, lines.append)
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["x"] == 1 and saved["memory"]["process_peak_rss_gb"] >= 0.25
    assert lines[0].startswith("memory: process peak RSS ")
