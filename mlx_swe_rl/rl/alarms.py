"""Alarms for runs that silently stop learning, from the run's history alone.

Each check is a pure function of the history records written so far (`history.jsonl`: one
`runfiles.StepRecord` per step, oldest first), the periodic evaluations' pass@1 and the thresholds of the
config's `alarms` section; it returns a one-line message when the run looks broken in its way,
or None. `new_alarms` runs them all after a step and keeps those that never tripped before
(an alarm's earlier trips are read from the records' "alarms" lists), so each alarm is printed
once and recorded in the step where it first tripped, also across `--resume`.

Why these: peers shipped releases whose policy gradient was silently zero (mlx-lm-lora #49,
#50, #55: `lora_b` stayed exactly 0), and one of this project's learning runs grew its
completions until 97% were truncated with nothing said during the run.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .config import AlarmConfig, Config
from ..runfiles import StepRecord

EvalPoint = tuple[int, float]  # (step, pass@1 over every evaluated puzzle); step 0 = eval-before


@dataclass(frozen=True)
class Alarm:
    name: str
    message: str

    def line(self, step: int) -> str:
        """The one line printed when the alarm trips."""
        return f"ALARM {self.name} at step {step}: {self.message}"


# --- the checks ----------------------------------------------------------------------------------

def no_gradient(history: Sequence[StepRecord], settings: AlarmConfig) -> str | None:
    """A step with completions in the loss whose gradient norm is exactly 0, or LoRA B matrices
    still all zero after the first update (the trainer's `lora_b_zero` check)."""
    last = history[-1]
    if last.lora_b_zero is True:
        return ("every LoRA B matrix is still exactly 0 after the first update: the adapters do not "
                "change the model (check optim.lr and the LoRA setup)")
    if last.grad_norm == 0.0 and (last.loss_completions or 0) > 0:
        return (f"gradient norm exactly 0 with {last.loss_completions} completions in the loss: no policy "
                "gradient reaches the trainable weights")
    return None


def zero_variance(history: Sequence[StepRecord], settings: AlarmConfig) -> str | None:
    """Most groups without reward variance (nothing to learn from), several steps in a row."""
    recent = _last(history, settings.steps, "zero_var_frac")
    if recent is None or min(recent) < settings.zero_var_frac:
        return None
    return (f"{_span(recent)} of the groups had equal rewards in each of the last {settings.steps} steps: almost "
            "nothing to learn from (the puzzles are too hard or too easy for the policy; try puzzles.select: mixed "
            "or other tiers)")


def truncation(history: Sequence[StepRecord], settings: AlarmConfig) -> str | None:
    """Many completions cut off at sampling.max_tokens, several steps in a row."""
    recent = _last(history, settings.steps, "truncation_rate")
    if recent is None or min(recent) < settings.truncation_rate:
        return None
    return (f"{_span(recent)} of the completions hit sampling.max_tokens in each of the last {settings.steps} "
            "steps (raise sampling.max_tokens; with grpo.mask_truncated they also leave the loss)")


def length_limit(history: Sequence[StepRecord], settings: AlarmConfig, max_tokens: int) -> str | None:
    """The mean completion length, smoothed by a line fit over the last `window` steps (their
    mean before there are that many), at `length_frac` of the token limit: completions are
    running into it."""
    recent = _last(history, min(settings.window, len(history)), "completion_len")
    if recent is None:
        return None
    # Before a whole window the plain mean: a line through two or three noisy steps overshoots.
    slope, fitted = line_fit(recent) if len(recent) == settings.window else (0.0, sum(recent) / len(recent))
    if fitted < settings.length_frac * max_tokens:
        return None
    trend = f" (rising {slope:+.1f} tokens/step)" if slope > 0 else ""
    return (f"mean completion length {fitted:.0f} tokens{trend}, {fitted / max_tokens:.0%} of "
            f"sampling.max_tokens={max_tokens} (lengths are running into the limit)")


def kl(history: Sequence[StepRecord], settings: AlarmConfig) -> str | None:
    """The KL to the reference above `kl_max`: the policy runs away from the reference."""
    value = history[-1].kl
    if value is None or value <= settings.kl_max:
        return None
    return f"KL to the reference {value:.3g} > {settings.kl_max:g}: the policy is running away (lower optim.lr?)"


def clip_frac(history: Sequence[StepRecord], settings: AlarmConfig) -> str | None:
    """More than `clip_frac_max` of the ratios clipped: updates are too large for the trust region."""
    value = history[-1].clip_frac
    if value is None or value <= settings.clip_frac_max:
        return None
    return (f"{value:.0%} of the token ratios were clipped (> {settings.clip_frac_max:.0%}): updates are too "
            "large (lower optim.lr or grpo.num_iterations?)")


def reward_vs_eval(history: Sequence[StepRecord], evals: Sequence[EvalPoint], settings: AlarmConfig) -> str | None:
    """The step reward rising while the periodic evaluation falls: the run learns its training
    puzzles' samples, not the task (or the evaluation set drifts away from training)."""
    if len(evals) < 2:
        return None
    *earlier, (last_step, last_score) = sorted(evals)
    best_step, best_score = max(earlier, key=lambda point: (point[1], -point[0]))
    if best_score - last_score < settings.eval_drop:
        return None
    rewards = [h.reward_mean for h in history if best_step < h.step <= history[-1].step]
    if len(rewards) < 2:
        return None
    slope, _ = line_fit(rewards)
    rise = slope * (len(rewards) - 1)
    if rise < settings.reward_rise:
        return None
    return (f"step reward rose {rise:+.2f} since step {best_step} while the eval's pass@1 fell "
            f"{best_score:.2f} -> {last_score:.2f} (step {last_step}): learning the training samples, not the task?")


# --- running them --------------------------------------------------------------------------------

def active_alarms(history: Sequence[StepRecord], evals: Sequence[EvalPoint], settings: AlarmConfig,
                  max_tokens: int) -> list[Alarm]:
    """Every alarm whose condition holds at the last record of `history` (oldest first)."""
    if not history or not settings.enabled:
        return []
    checks: list[tuple[str, Callable[[], str | None]]] = [
        ("no_gradient", lambda: no_gradient(history, settings)),
        ("zero_variance", lambda: zero_variance(history, settings)),
        ("truncation", lambda: truncation(history, settings)),
        ("length_limit", lambda: length_limit(history, settings, max_tokens)),
        ("kl", lambda: kl(history, settings)),
        ("clip_frac", lambda: clip_frac(history, settings)),
        ("reward_vs_eval", lambda: reward_vs_eval(history, evals, settings)),
    ]
    return [Alarm(name, message) for name, check in checks if (message := check()) is not None]


def new_alarms(history: Sequence[StepRecord], evals: Sequence[EvalPoint], settings: AlarmConfig,
               max_tokens: int) -> list[Alarm]:
    """The alarms that trip at the last record and never tripped in an earlier one."""
    tripped = {a["name"] for h in history[:-1] for a in h.alarms or ()}
    return [a for a in active_alarms(history, evals, settings, max_tokens) if a.name not in tripped]


def as_records(alarms: Sequence[Alarm]) -> list[dict[str, str]]:
    """The history record's "alarms" value."""
    return [asdict(a) for a in alarms]


# --- the run directory's side --------------------------------------------------------------------

EVAL_FILE = re.compile(r"eval-step-(\d+)\.json$")


def eval_score(report: dict[str, Any]) -> float:
    """Mean pass@1 (avg@K) over every puzzle of an evaluation report."""
    return next(t["pass@1"] for t in report["totals"] if t.get("tier") == "all" and t.get("split") == "all")


def eval_points(run_dir: Path, before_step: int) -> list[EvalPoint]:
    """(step, pass@1) of the run's evaluations before `before_step`: eval-before.json as step 0
    and the periodic eval-step-XXXX.json files (later ones, left by a killed run, are skipped)."""
    points = []
    for path in sorted(run_dir.glob("eval-*.json")):
        match = EVAL_FILE.search(path.name)
        step = 0 if path.name == "eval-before.json" else int(match.group(1)) if match else None
        if step is None or step >= before_step:
            continue
        try:
            points.append((step, eval_score(json.loads(path.read_text()))))
        except (OSError, ValueError, KeyError, StopIteration):
            continue  # a half-written or foreign file says nothing about the trend
    return points


def lora_b_all_zero(model: Any) -> bool | None:
    """True when the model has LoRA layers and every lora_b is exactly zero (None: no LoRA)."""
    import mlx.core as mx

    from .policy import lora_layers

    layers = lora_layers(model)
    if not layers:
        return None
    return all(not mx.any(layer.lora_b != 0).item() for layer in layers)


# --- helpers -------------------------------------------------------------------------------------

def _last(history: Sequence[StepRecord], n: int, key: str) -> list[float] | None:
    """`key` of the last n records, or None when there are fewer or one lacks it."""
    if len(history) < n:
        return None
    values = [getattr(h, key) for h in history[-n:]]
    return None if any(v is None for v in values) else [float(v) for v in values]


def _span(values: Sequence[float]) -> str:
    low, high = f"{min(values):.0%}", f"{max(values):.0%}"
    return low if low == high else f"{low}-{high}"


def line_fit(values: Sequence[float]) -> tuple[float, float]:
    """Least-squares line through (0, v0), (1, v1), ...: (slope per step, its value at the last)."""
    n = len(values)
    if n == 1:
        return 0.0, float(values[0])
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    slope = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values)) / sum((i - mean_x) ** 2 for i in range(n))
    return slope, mean_y + slope * (n - 1 - mean_x)


def sound_alarms(history: list[StepRecord], model: Any, cfg: Config, run_dir: Path,
                 log: Callable[[str], None]) -> None:
    """After a step (the last record of `history`): the one-time LoRA B check after the first
    update, then every alarm that trips for the first time, logged and added to the record."""
    record = history[-1]
    if record.loss_completions and not any(h.lora_b_zero is not None for h in history):
        record.lora_b_zero = lora_b_all_zero(model)  # None without LoRA: nothing recorded
    tripped = new_alarms(history, eval_points(run_dir, record.step), cfg.alarms, cfg.sampling.max_tokens)
    if tripped:
        record.alarms = as_records(tripped)
    for alarm in tripped:
        log(alarm.line(record.step))
