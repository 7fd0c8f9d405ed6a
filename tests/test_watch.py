"""`mlx-swe-rl watch`: the page and its JSON endpoints, served from a run directory's files,
following a run that is still being written, on 127.0.0.1 only."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mlx_swe_rl.cli.app import main
from mlx_swe_rl.env.verdict import Verdict
from mlx_swe_rl.models.sampling import Sample
from mlx_swe_rl.sandbox.verdict import TestResult as Outcome
from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.reports.watch import PAGE_DIR, JsonlTail, WatchError, open_server
from mlx_swe_rl.rl.evaluation import totals
from mlx_swe_rl.rl.rollouts import DETAIL_CHARS, Episode
from mlx_swe_rl.rl.stats import compare_reports

PUZZLE = "average_score"  # a bundled easy puzzle
HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def history_line(step: int, **extra) -> dict:
    return {"step": step, "reward_mean": 0.1 * step, "solve_rate": 0.05 * step, "loss": 0.01, "kl": 0.001 * step,
            "entropy": 0.5, "clip_frac": 0.0, "grad_norm": 0.3, "zero_var_frac": 0.5, "completion_len": 40.0 + step,
            "truncation_rate": 0.1, "step_s": 12.0, "sample_s": 8.0, "update_s": 3.0, "peak_memory_gb": 1.5,
            "puzzles": [PUZZLE], **extra}


def eval_report(rates: dict[str, float], split: str = "train") -> dict:
    rows = [{"id": pid, "tier": "easy", "split": split, "family": None, "samples": 1, "solved": int(r),
             "pass@1": r, "completions": []} for pid, r in rates.items()]
    return {"settings": {"samples": 1, "temperature": 0.0}, "totals": totals(rows, 1), "puzzles": rows}


def write_jsonl(path: Path, records: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run of two steps on a bundled puzzle: config, history (step 2 tripped an alarm),
    rollouts with code and test outcomes, evaluations before and after."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({
        "run_name": "watched", "model": {"spec": "smollm2-135m", "dtype": "float32"},
        "puzzles": {"dir": None, "train_set": None, "tiers": ["easy"], "split": "train"},
        "sampling": {"group_size": 2, "max_tokens": 64}, "optim": {"max_grad_norm": 1.0},
        "train": {"steps": 4, "final_eval": True}}))
    write_jsonl(run / "history.jsonl", [history_line(1), history_line(2, alarms=[
        {"name": "truncation", "message": "62% of completions hit sampling.max_tokens=64"}])])
    buggy = next(p for p in load_puzzles(tiers=["easy"]) if p.id == PUZZLE).buggy
    fixed = buggy.replace("return total //", "return total /")
    lines = []
    for step in (1, 2):
        lines.append({"step": step, "puzzle_id": PUZZLE, "reward": 1.0, "solved": True, "tokens": 30,
                      "truncated": False, "completion": f"Fixed:\n```python\n{fixed}```\n{HOSTILE}", "code": fixed,
                      "tests": [{"status": "passed", "detail": ""}, {"status": "passed", "detail": ""}]})
        lines.append({"step": step, "puzzle_id": PUZZLE, "reward": 0.0, "solved": False, "tokens": 64,
                      "truncated": True, "completion": "I think", "code": None, "tests": []})
    write_jsonl(run / "rollouts.jsonl", lines)
    before = eval_report({PUZZLE: 0.0, "clamp_value": 1.0})
    after = eval_report({PUZZLE: 1.0, "clamp_value": 1.0})
    after["change_vs_before"] = compare_reports(before, after)
    (run / "eval-before.json").write_text(json.dumps(before))
    (run / "eval-after.json").write_text(json.dumps(after))
    return run


@pytest.fixture
def server(run_dir):
    srv = open_server(run_dir, 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def get(server, path: str, host: str | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(server.url.rstrip("/") + path)
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def strict_json(body: bytes):
    """What a browser's JSON.parse accepts: no NaN or Infinity."""
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(body, parse_constant=refuse)


def data(server) -> dict:
    status, headers, body = get(server, "/api/data")
    assert status == 200 and headers["Content-Type"] == "application/json"
    return strict_json(body)


# --- the page ------------------------------------------------------------------------------------
def test_the_page_loads_its_own_script_and_styles_and_forbids_inline_code(server):
    status, headers, body = get(server, "/")
    page = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert '<script src="/watch.js"></script>' in page and 'href="/watch.css"' in page
    assert not re.search(r"<script>|\son\w+=|https?://", page)  # no inline code, nothing fetched from elsewhere
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    for path, kind in (("/watch.js", "text/javascript"), ("/watch.css", "text/css")):
        status, headers, body = get(server, path)
        assert status == 200 and headers["Content-Type"].startswith(kind) and len(body) > 1000
    assert get(server, "/elsewhere")[0] == 404


def test_the_script_inserts_run_text_as_text_only():
    """Model output is untrusted: the page must never parse it as HTML."""
    script = (PAGE_DIR / "watch.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink
    assert "http://" not in script.replace("http://www.w3.org/2000/svg", "") and "https://" not in script


def test_the_data_endpoint_holds_history_alarms_evaluations_and_config(server):
    d = data(server)
    assert d["run_name"] == "watched" and d["model"] == "smollm2-135m"
    assert d["max_tokens"] == 64 and d["total_steps"] == 4
    assert [h["step"] for h in d["history"]] == [1, 2]
    assert d["history"][1]["completion_len"] == 42.0
    assert d["alarms"] == [{"step": 2, "name": "truncation", "message": "62% of completions hit sampling.max_tokens=64"}]
    assert [e["name"] for e in d["evals"]] == ["before", "after"]
    after = d["evals"][1]
    total = next(t for t in after["totals"] if t.get("tier") == "all" and t["split"] == "all")
    assert total["pass@1"] == 1.0 and len(total["ci95"]) == 2
    assert after["change_vs_before"]["all"]["change"] == 0.5 and d["evals"][0]["change_vs_before"] is None
    assert d["puzzle_changes"] == {"from": "before", "to": "after", "improved": [PUZZLE], "worsened": []}
    assert "max_tokens: 64" in d["config_text"] and d["config"]["optim"]["max_grad_norm"] == 1.0
    assert d["rollout_steps"] == [{"step": 1, "solved": 1, "completions": 2, "errored": 0},
                                  {"step": 2, "solved": 1, "completions": 2, "errored": 0}]
    assert [h["errored"] for h in d["history"]] == [0, 0]  # records written before `errored` existed: 0


def test_a_live_run_shows_new_steps_and_tolerates_a_line_being_written(server, run_dir):
    history = run_dir / "history.jsonl"
    assert len(data(server)["history"]) == 2
    with open(history, "a") as f:
        f.write(json.dumps(history_line(3)) + "\n")
    assert [h["step"] for h in data(server)["history"]] == [1, 2, 3]
    half = json.dumps(history_line(4))
    with open(history, "a") as f:  # the trainer is in the middle of appending step 4
        f.write(half[:25])
    assert [h["step"] for h in data(server)["history"]] == [1, 2, 3]
    with open(history, "a") as f:
        f.write(half[25:] + "\n")
    assert [h["step"] for h in data(server)["history"]] == [1, 2, 3, 4]
    with open(run_dir / "rollouts.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "puzzle_id": PUZZLE, "reward": 0.0, "solved": False, "completion": "x",
                            "code": None, "tests": []}) + "\n" + '{"step": 4, "puzz')
    assert data(server)["rollout_steps"][-1] == {"step": 3, "solved": 0, "completions": 1, "errored": 0}
    assert strict_json(get(server, "/api/rollouts")[2])["step"] == 3


def test_a_resumed_run_that_rewrites_its_history_is_read_again(server, run_dir):
    assert len(data(server)["history"]) == 2
    # --resume drops the lines after its checkpoint and appends new ones: same size, other content
    write_jsonl(run_dir / "history.jsonl", [history_line(1), history_line(2, reward_mean=0.99)])
    assert data(server)["history"][1]["reward_mean"] == 0.99
    write_jsonl(run_dir / "history.jsonl", [history_line(1)])
    assert [h["step"] for h in data(server)["history"]] == [1]


def test_broken_and_missing_files_do_not_stop_the_page(server, run_dir):
    write_jsonl(run_dir / "history.jsonl", [history_line(1)], tail="not json\n[1, 2]\n" + json.dumps(history_line(2)) + "\n")
    before = json.loads((run_dir / "eval-before.json").read_text())
    before["totals"][0]["ci95"] = [float("nan"), float("nan")]  # a bootstrap over no puzzles
    (run_dir / "eval-before.json").write_text(json.dumps(before))
    (run_dir / "eval-step-0002.json").write_text('{"totals": [')  # being written
    (run_dir / "rollouts.jsonl").unlink()
    d = data(server)
    assert [h["step"] for h in d["history"]] == [1, 2]
    assert d["evals"][0]["totals"][0]["ci95"] == [None, None]
    assert [e["name"] for e in d["evals"]] == ["before", "after"]
    assert d["rollout_steps"] == []
    assert strict_json(get(server, "/api/rollouts")[2]) == {"step": None, "puzzles": []}
    assert get(server, "/api/rollouts?step=x")[0] == 400


def test_jsonl_tail_reads_only_complete_lines(tmp_path):
    path = tmp_path / "h.jsonl"
    tail = JsonlTail(path)
    assert tail.read() == []
    path.write_text('{"step": 1}\n{"step"')
    assert tail.read() == [{"step": 1}]
    with open(path, "a") as f:
        f.write(': 2}\n')
    assert tail.read() == [{"step": 1}, {"step": 2}]
    path.unlink()
    assert tail.read() == []


# --- rollouts ------------------------------------------------------------------------------------
def test_rollouts_of_a_step_come_with_diffs_against_the_buggy_code_and_test_outcomes(server):
    status, _, body = get(server, "/api/rollouts?step=1")
    assert status == 200
    r = strict_json(body)
    assert r["step"] == 1 and [p["id"] for p in r["puzzles"]] == [PUZZLE]
    puzzle = r["puzzles"][0]
    assert puzzle["tier"] == "easy" and "def average_score" in puzzle["buggy"]
    assert puzzle["solved"] == 1 and puzzle["mean_reward"] == 0.5
    good, bad = puzzle["rollouts"]
    assert good["diff"][:2] == ["--- buggy", "+++ model"]
    assert any(line.startswith("-") and "//" in line for line in good["diff"])
    assert any(line.startswith("+") and "total /" in line for line in good["diff"])
    assert [t["status"] for t in good["tests"]] == ["passed", "passed"]
    assert HOSTILE in good["completion"]  # data stays verbatim; the page inserts it as text
    assert bad["code"] is None and bad["diff"] is None and bad["truncated"] is True
    assert strict_json(get(server, "/api/rollouts")[2])["step"] == 2  # default: the latest step


def test_older_rollout_lines_get_their_code_extracted_and_unknown_puzzles_no_diff(server, run_dir):
    buggy = next(p for p in load_puzzles(tiers=["easy"]) if p.id == PUZZLE).buggy
    write_jsonl(run_dir / "rollouts.jsonl", [
        {"step": 1, "puzzle_id": PUZZLE, "reward": 0.0, "solved": False, "completion": f"```python\n{buggy}```"},
        {"step": 1, "puzzle_id": "not_a_puzzle", "reward": 0.0, "solved": False, "completion": "x",
         "code": "def f():\n    pass", "tests": []}])
    old, unknown = (p["rollouts"][0] for p in strict_json(get(server, "/api/rollouts?step=1")[2])["puzzles"])
    assert old["code"] == buggy.rstrip("\n") and old["diff"] == [] and old["tests"] is None
    assert unknown["code"] == "def f():\n    pass" and unknown["diff"] is None


def test_rollout_summary_is_what_rollouts_jsonl_records():
    verdict = Verdict("p", 0.0, False, "def f(): pass", None, {"tests": 0.0}, passed=1, total=2,
                      tests=[Outcome(0, "passed"), Outcome(1, "failed", "expected 1, got " + "9" * 500)])
    line = Episode.single(Sample(0, [5, 6, 7], "text", [], "length"), verdict).summary()
    assert line == {"puzzle_id": "p", "reward": 0.0, "solved": False, "text": "text", "num_tokens": 3,
                    "truncated": True, "code": "def f(): pass",
                    "tests": [{"status": "passed", "detail": ""}, {"status": "failed", "detail": line["tests"][1]["detail"]}],
                    "turns": [{"text": "text", "num_tokens": 3, "finish": "length", "code": "def f(): pass",
                               "public_ok": None, "public_passed": None, "solved": False, "reward": 0.0, "feedback": None}]}
    assert len(line["tests"][1]["detail"]) == DETAIL_CHARS and line["tests"][1]["detail"].startswith("expected 1, got 99")
    json.dumps(line)


# --- where it listens; the command line ----------------------------------------------------------
def non_loopback_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_it_listens_on_loopback_only_and_refuses_foreign_host_names(server):
    host, port = server.server_address[:2]
    assert host == "127.0.0.1" and server.url == f"http://127.0.0.1:{port}/"
    address = non_loopback_address()
    if address is not None:
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=2).close()
    assert get(server, "/api/data", host=f"evil.example:{port}")[0] == 403  # DNS rebinding
    assert get(server, "/", host=f"localhost:{port}")[0] == 200


@pytest.mark.parametrize("make, needle", [
    (lambda tmp: tmp / "missing", "no such directory"),
    (lambda tmp: tmp, "not a run directory (no config.yaml or history.jsonl)"),
])
def test_a_bad_run_dir_is_a_one_line_error(tmp_path, make, needle):
    target = make(tmp_path)
    result = CliRunner().invoke(main, ["watch", str(target), "--port", "0"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [f"Error: {target}: {needle}"]


def test_a_port_in_use_is_a_one_line_error(run_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["watch", str(run_dir), "--port", str(port)])
        with pytest.raises(WatchError, match="--port: cannot listen"):
            open_server(run_dir, port)
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert result.output.startswith(f"Error: --port: cannot listen on 127.0.0.1:{port}")


def test_a_multi_turn_rollout_shows_its_turns_and_the_feedback():
    from mlx_swe_rl.reports.watch import _rollout_view

    line = {"reward": 1.0, "solved": True, "completion": "```python\ndef f():\n    return 2\n```", "code": "def f():\n    return 2",
            "tests": [], "turns": [{"completion": "first try", "code": None, "public_ok": False, "solved": False,
                                    "feedback": "Your reply held no code."},
                                   {"completion": "second", "code": "def f():\n    return 2", "public_ok": True,
                                    "solved": True, "feedback": None}]}
    view = _rollout_view(line, None)
    assert [t["completion"] for t in view["turns"]] == ["first try", "second"]
    assert view["turns"][0]["feedback"] == "Your reply held no code." and view["turns"][1]["feedback"] is None
    assert _rollout_view({"completion": "x"}, None)["turns"] is None  # single-turn lines have none


def test_errored_steps_and_the_error_on_a_rollout_are_shown(server, run_dir):
    """A puzzle that could not be scored: the step's `errored` count (history and rollouts) and
    the error on each of its rollouts; the page draws both only when there is one."""
    error = "test 0: oracle did not finish: RuntimeError: oracle down"
    with open(run_dir / "history.jsonl", "a") as f:
        f.write(json.dumps(history_line(3, errored=2)) + "\n")
    with open(run_dir / "rollouts.jsonl", "a") as f:
        for _ in range(2):
            f.write(json.dumps({"step": 3, "puzzle_id": "broken", "reward": 0.0, "solved": False, "completion": "x",
                                "code": None, "tests": [], "error": error}) + "\n")
        f.write(json.dumps({"step": 3, "puzzle_id": PUZZLE, "reward": 0.0, "solved": False, "completion": "y",
                            "code": None, "tests": []}) + "\n")
    d = data(server)
    assert [h["errored"] for h in d["history"]] == [0, 0, 2]
    assert d["rollout_steps"][-1] == {"step": 3, "solved": 0, "completions": 3, "errored": 2}
    puzzles = {p["id"]: p for p in strict_json(get(server, "/api/rollouts?step=3")[2])["puzzles"]}
    assert [r["error"] for r in puzzles["broken"]["rollouts"]] == [error, error]
    assert puzzles[PUZZLE]["rollouts"][0]["error"] is None
    script = (PAGE_DIR / "watch.js").read_text()
    assert "r.errored > 0" in script and "r.error ?" in script and "not scored" in script


def test_rollout_summary_carries_the_error_of_an_error_verdict():
    verdict = Verdict("p", 0.0, False, None, None, {"tests": 0.0}, passed=0, total=2,
                      error="oracle failed to load: " + "x" * 900)
    line = Episode.single(Sample(0, [5], "text", [], "eos"), verdict).summary()
    assert line["error"].startswith("oracle failed to load: ") and len(line["error"]) == 500
    fine = dataclasses.replace(verdict, error=None)
    assert "error" not in Episode.single(Sample(0, [5], "text", [], "eos"), fine).summary()


def test_pass_rate_estimates_are_shown_when_the_run_keeps_them(server, run_dir):
    """passrates.json (written by the trainer after every step) becomes a table, most learnable
    first; a run without it, or with a broken one, shows none and the page still works."""
    from mlx_swe_rl.rl.passrates import PassRates

    assert data(server)["pass_rates"] is None  # a run made before pass rates were kept
    rates = PassRates.start([PUZZLE, "clamp_value", "digit_sum"], decay=0.9,
                            calibration={"puzzles": [{"id": "clamp_value", "solved": 8, "samples": 8}]})
    rates.observe(1, [{"puzzle_id": PUZZLE, "solved": i % 2 == 0} for i in range(4)])
    (run_dir / "passrates.json").write_text(json.dumps(rates.to_json()))
    shown = data(server)["pass_rates"]
    assert shown["step"] == 1 and shown["decay"] == 0.9
    assert [r["id"] for r in shown["puzzles"]] == [PUZZLE, "digit_sum", "clamp_value"]
    first = shown["puzzles"][0]
    assert first["mean"] == 0.5 and first["outcomes"] == 4.0 and first["last_step"] == 1
    assert shown["puzzles"][2]["last_step"] == 0 and shown["puzzles"][2]["mean"] > 0.8
    (run_dir / "passrates.json").write_text('{"puzzles": ')  # being written: the last good one stays
    assert data(server)["pass_rates"]["step"] == 1
    page = get(server, "/")[2].decode()
    script = (PAGE_DIR / "watch.js").read_text()
    assert 'id="pass-rates"' in page and "drawPassRates(d)" in script and "Pass-rate estimates" in script


def test_the_page_reads_rollout_lines_of_today_and_of_older_runs():
    """rollouts.jsonl took the evaluation reports' keys (text, num_tokens); runs written before
    (completion, tokens) still show their completions."""
    from mlx_swe_rl.reports.watch import _rollout_view

    verdict = Verdict("p", 0.0, False, None, None, {}, passed=0, total=1)
    today = Episode.single(Sample(0, [5, 6], "I think", [], "stop"), verdict).summary()
    older = {"reward": 0.0, "solved": False, "completion": "I think", "tokens": 2, "code": None, "tests": []}
    for line in (today, older):
        view = _rollout_view(line, None)
        assert view["completion"] == "I think" and view["tokens"] == 2
