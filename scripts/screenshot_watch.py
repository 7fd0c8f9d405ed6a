"""Screenshot of `mlx-swe-rl watch` for a run directory, with headless Chromium.

    python scripts/screenshot_watch.py RUN_DIR OUT.png [--width 1400] [--height 2200]

Starts the watch server on a free loopback port in this process, lets Chromium load the page
and run its script (a virtual-time budget), writes the PNG and stops the server. Needs the
Debian package `chromium` (`apt-get install -y chromium`) or another Chromium on PATH.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from mlx_swe_rl.reports.watch import WatchError, open_server

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    sys.exit("no Chromium found: apt-get install -y chromium (as root)")


def screenshot(run_dir: Path, out: Path, width: int, height: int, budget_ms: int) -> None:
    """Serve `run_dir`, point headless Chromium at it, write `out`."""
    try:
        server = open_server(run_dir, 0)
    except WatchError as exc:
        sys.exit(str(exc))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    profile = tempfile.mkdtemp(prefix="watch-chromium-")
    try:
        command = [find_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={width},{height}",
                   f"--virtual-time-budget={budget_ms}", f"--screenshot={out.resolve()}", server.url]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0 or not out.is_file():
            sys.exit(f"chromium failed ({result.returncode}): {result.stderr.strip()[-500:]}")
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(profile, ignore_errors=True)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=2200)
    parser.add_argument("--budget-ms", type=int, default=5000, help="virtual time for the page's script")
    args = parser.parse_args()
    screenshot(args.run_dir, args.out, args.width, args.height, args.budget_ms)


if __name__ == "__main__":
    main()
