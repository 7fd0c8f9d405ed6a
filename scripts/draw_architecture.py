"""Draw docs/architecture.png (and .pdf) for the README: `python scripts/draw_architecture.py`."""

from pathlib import Path

from mlx_swe_rl.reports.figures import architecture

if __name__ == "__main__":
    for path in architecture(Path(__file__).resolve().parents[1] / "docs" / "architecture"):
        print(f"wrote {path}")
