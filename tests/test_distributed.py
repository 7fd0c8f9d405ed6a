"""Data-parallel GRPO (mlx_swe_rl.distributed) with two ranks on localhost over MLX's ring backend.

Each launch runs tests/dist_worker.py, whose rollouts are fixed functions of the puzzle ids, so
a 2-rank run and a 1-rank run see the same data and must make the same updates. Where the
weights are compared after several updates, the worker uses plain SGD: AdamW divides each
gradient element by its own magnitude, so a gradient element that is ~0 up to rounding (the
order of a sum differs between one rank and two) becomes a step of size lr in either direction,
which would test Adam's sensitivity rather than the reduction. AdamW runs where the sums are
exact in any order (one or two groups per step).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "dist_worker.py"
TOL = dict(rtol=1e-5, atol=1e-7)

# (run spec, what it covers); every run: tiny model, LoRA, beta 0.04, G = 4, 2 steps, micro-batch 2.
RUNS = {
    "sgd-even": "optimizer=sgd,train.puzzles_per_step=4",  # 2 puzzles per rank, micro-batches split groups
    # learnable order: step 2's choice reads pass rates updated from both ranks' rollouts
    "sgd-uneven": "optimizer=sgd,train.puzzles_per_step=3,grpo.aggregation=token_mean,grpo.num_iterations=2,"
                  "train.order=learnable",
    "adam-idle": "train.puzzles_per_step=1",  # rank 1 has no puzzle: it still joins every collective
    "adam-pair": "train.puzzles_per_step=2,train.micro_batch_size=4,train.order=learnable",
    "eval": "env=real,train.puzzles_per_step=2,train.final_eval=true,train.eval_every=1,train.eval_tiers=[easy]",
}
# Killed after step 1 and resumed: rank 1 builds a fresh model and must get weights, AdamW
# state and pass rates from rank 0 (its own output_dir does not exist); must end where
# adam-pair ends.
RESUME = [("adam-resume", RUNS["adam-pair"] + ",stop_after=1"), ("adam-resume", RUNS["adam-pair"] + ",resume=1")]


def launcher() -> str | None:
    beside = Path(sys.executable).parent / "mlx.launch"
    return str(beside) if beside.is_file() else shutil.which("mlx.launch")


def free_port() -> int:
    """A port p with p and p + 1 free (the ring backend listens on one port per rank)."""
    for _ in range(20):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def child_env(**extra: str) -> dict[str, str]:
    # One BLAS thread per rank: two ranks share the CI machine's two cores.
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def launch(ranks: int, args: list[str], timeout: float = 120, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run the worker on `ranks` ranks (1: plain python, no launcher); returns the result and seconds."""
    command = [sys.executable, str(WORKER), *args]
    if ranks > 1:
        command = [launcher(), "--backend", "ring", "-n", str(ranks), "--starting-port", str(free_port()), *command]
    start = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, env=child_env(**env), capture_output=True, text=True,
                            timeout=timeout)
    return result, time.monotonic() - start


def output(result: subprocess.CompletedProcess) -> str:
    return f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


@pytest.fixture(scope="module")
def ring():
    """Skip the module unless mlx.launch can run two ranks over the ring backend here."""
    exe = launcher()
    if exe is None:
        pytest.skip("mlx.launch is not installed (pip install mlx)")
    probe = ("import mlx.core as mx; g = mx.distributed.init(); x = mx.distributed.all_sum(mx.array([1.0])); "
             "mx.eval(x); print('ring-ok', g.size(), x.item())")
    try:
        result = subprocess.run([exe, "--backend", "ring", "-n", "2", "--starting-port", str(free_port()),
                                 sys.executable, "-c", probe], cwd=ROOT, env=child_env(), capture_output=True,
                                text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.skip("mlx.launch --backend ring -n 2 did not finish a trivial all_sum within 60 s")
    if result.stdout.count("ring-ok 2 2.0") != 2:
        pytest.skip(f"the MLX ring backend does not work on this machine: {output(result)}")
    return exe


def run_args(model_dir: Path, out: Path, runs: list[tuple[str, str]]) -> list[str]:
    args = ["--model", str(model_dir), "--out", str(out), "--dump", str(out / "dump")]
    for name, spec in runs:
        args += ["--run", f"{name}:{spec}"]
    return args


@pytest.fixture(scope="module")
def runs(ring, tiny_model_dir, tmp_path_factory):
    """The same runs on one rank (no launcher) and on two ranks."""
    root = tmp_path_factory.mktemp("dist")
    specs = list(RUNS.items())
    one, one_s = launch(1, run_args(tiny_model_dir, root / "one", [r for r in specs if r[0] != "eval"]))
    assert one.returncode == 0, output(one)
    two, two_s = launch(2, run_args(tiny_model_dir, root / "two", specs + RESUME))
    assert two.returncode == 0 and two.stdout.count("done") == 2, output(two)
    print(f"1 rank: {one_s:.1f}s, 2 ranks: {two_s:.1f}s")
    return {"one": root / "one", "two": root / "two", "two_output": two}


def load(path: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(path)).items()}


def history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", ["sgd-even", "sgd-uneven", "adam-idle", "adam-pair"])
def test_two_ranks_make_the_one_rank_update(runs, name):
    one = load(runs["one"] / name / "adapters.safetensors")
    two = load(runs["two"] / name / "adapters.safetensors")
    assert one.keys() == two.keys() and one
    for key in one:
        np.testing.assert_allclose(two[key], one[key], err_msg=key, **TOL)
    assert any(np.abs(v).max() > 1e-4 for k, v in two.items() if "lora_b" in k)  # it did train
    # Every rank holds the same weights (the reduced gradient is the same everywhere).
    rank0 = load(runs["two"] / "dump" / f"{name}.rank0.safetensors")
    rank1 = load(runs["two"] / "dump" / f"{name}.rank1.safetensors")
    assert all(np.array_equal(rank0[k], rank1[k]) for k in rank0)


@pytest.mark.parametrize("name", ["sgd-even", "sgd-uneven", "adam-idle"])
def test_history_and_rollouts_cover_all_ranks(runs, name):
    h1, h2 = history(runs["one"] / name), history(runs["two"] / name)
    assert [h["step"] for h in h2] == [1, 2]
    for a, b in zip(h1, h2):
        for key in ("reward_mean", "solve_rate", "zero_var_frac", "loss_completions", "completion_len",
                    "truncation_rate", "puzzles"):
            assert b[key] == a[key], key
        for key in ("loss", "policy_loss", "kl", "entropy", "clip_frac", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    # All ranks' completions, in the step's puzzle order, written once.
    assert (runs["two"] / name / "rollouts.jsonl").read_text() == (runs["one"] / name / "rollouts.jsonl").read_text()
    # Every rank returned the same (reduced) history.
    ranks = [json.loads((runs["two"] / "dump" / f"{name}.rank{r}.json").read_text()) for r in (0, 1)]
    assert [h["loss"] for h in ranks[0]] == [h["loss"] for h in ranks[1]]


def test_only_rank_0_writes(runs):
    two = runs["two"]
    assert not Path(f"{two}-rank1").exists()  # rank 1's output_dir: never created, never read
    expected = {"config.yaml", "history.jsonl", "rollouts.jsonl", "adapters.safetensors", "adapter_config.json",
                "checkpoint"}
    for name in RUNS:
        found = {p.name for p in (two / name).iterdir()}
        assert expected <= found, name
        assert not {f for f in found if "rank" in f}, found
        assert len(history(two / name)) == 2  # one line per step, not one per rank
    evals = {p.name for p in (two / "eval").glob("eval-*.json")}
    assert evals == {"eval-before.json", "eval-step-0001.json", "eval-after.json"}
    stdout = runs["two_output"].stdout
    assert stdout.count("greedy eval") == 3  # printed by rank 0 only


def test_resume_gets_weights_and_optimizer_state_from_rank_0(runs):
    two = runs["two"]
    assert [h["step"] for h in history(two / "adam-resume")] == [1, 2]
    resumed = load(two / "adam-resume" / "adapters.safetensors")
    straight = load(two / "adam-pair" / "adapters.safetensors")
    for key in straight:
        np.testing.assert_allclose(resumed[key], straight[key], err_msg=key, **TOL)
    rank0 = load(two / "dump" / "adam-resume.rank0.safetensors")
    rank1 = load(two / "dump" / "adam-resume.rank1.safetensors")
    assert all(np.array_equal(rank0[k], rank1[k]) for k in rank0)


def test_a_crashed_rank_stops_the_run(ring, tiny_model_dir, tmp_path):
    """mlx.launch terminates the other ranks when one exits non-zero (and the ring backend fails
    their pending collective at once); note that mlx.launch itself exits 0 (MLX 0.32)."""
    args = run_args(tiny_model_dir, tmp_path / "out", [("crash", "train.puzzles_per_step=2")])
    result, seconds = launch(2, args + ["--crash-rank", "1", "--crash-step", "1"], timeout=60)
    text = output(result)
    assert seconds < 60, text
    assert "rank 1: crashing at step 1" in result.stderr, text
    assert "Node with rank 1 exited with code 3" in result.stderr, text
    assert "done" not in result.stdout, text
    assert not (tmp_path / "out" / "crash" / "history.jsonl").exists()


def test_a_hung_rank_stops_the_run_after_the_timeout(ring, tiny_model_dir, tmp_path):
    args = run_args(tiny_model_dir, tmp_path / "out", [("hang", "train.puzzles_per_step=2")])
    result, seconds = launch(2, args + ["--hang-rank", "1", "--hang-step", "2"], timeout=60,
                             MLX_SWE_RL_DIST_TIMEOUT="6")
    text = output(result)
    assert seconds < 60, text
    assert "rank 0 waited more than 6s for the other ranks" in result.stderr, text
    assert "MLX_SWE_RL_DIST_TIMEOUT" in result.stderr, text
    assert "Node with rank 0 exited with code 75" in result.stderr, text
    assert "done" not in result.stdout, text
    assert [h["step"] for h in history(tmp_path / "out" / "hang")] == [1]


# ------------------------------------------------------------------------------ without a launcher
@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"])
def test_token_weights_of_parts_with_the_whole_steps_totals(aggregation):
    from mlx_swe_rl.rl.grpo import token_weights

    lengths = [3, 0, 7, 1, 5, 0, 2]
    whole = token_weights(mx.array(lengths), aggregation, 8).tolist()
    kept, tokens = sum(n > 0 for n in lengths), sum(lengths)
    parts = [token_weights(mx.array(lengths[r::2]), aggregation, 8, total_kept=kept, total_tokens=tokens).tolist()
             for r in (0, 1)]
    np.testing.assert_allclose([parts[i % 2][i // 2] for i in range(len(lengths))], whole, rtol=1e-7)


def test_one_process_is_a_group_of_one():
    """Not launched: every helper returns its input, nothing is sent, no watchdog runs."""
    from mlx_swe_rl.rl import distributed as dist

    assert (dist.rank(), dist.size(), dist.is_main()) == (0, 1, True)
    items = list(range(5))
    assert dist.shard(items) == items and dist.unshard(items) == items
    values = {"a": 1, "b": 2.5}
    assert dist.all_sum(values) == values and dist.all_max(values) == values and dist.broadcast(values) == values
    tree = {"w": mx.ones((2, 2))}
    assert dist.all_sum_tree(tree) is tree and dist.broadcast_tree(tree) is tree
    dist.barrier("nothing")
    assert dist._watchdog.thread is None
