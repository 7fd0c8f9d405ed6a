// mlx-swe-rl watch: draws a run from /api/data and /api/rollouts, polling every few seconds.
// All text from the run (model output above all) goes into the page as text nodes
// (textContent), never as HTML.
"use strict";

const POLL_MS = 3000;
const SVG_NS = "http://www.w3.org/2000/svg";
const CHARTS = [
  {title: "Reward and solve rate", key: "reward", min: 0, max: 1, smooth: true,
   series: [["reward_mean", "reward mean", "#264653"], ["solve_rate", "solve rate", "#2a9d8f"]]},
  {title: "Completion length (tokens)", min: 0, limit: d => d.max_tokens, limitLabel: "sampling.max_tokens",
   series: [["completion_len", "mean length", "#3a6ea5"]]},
  {title: "Truncated completions", min: 0, max: 1, percent: true,
   series: [["truncation_rate", "hit the token limit", "#f4a261"]]},
  {title: "Zero-variance groups (no signal)", min: 0, max: 1, percent: true,
   series: [["zero_var_frac", "groups with equal rewards", "#8a94a6"]]},
  // only for runs with dynamic sampling (train.dynamic_sampling): replacement groups were drawn
  {title: "Groups per step (dynamic sampling)", min: 0, when: d => cfg(d, "train", "dynamic_sampling")?.enabled === true,
   series: [["groups_sampled", "sampled", "#8a94a6"], ["groups_kept", "in the loss", "#2a9d8f"],
            ["extra_groups", "replacements", "#e9c46a"]]},
  // only for runs that had a puzzle the scorer could not score (its episodes got reward 0, no loss)
  {title: "Episodes not scored (puzzle errors)", min: 0, when: d => d.history.some(r => r.errored > 0),
   series: [["errored", "error verdicts", "#d1495b"]]},
  {title: "KL to the reference", min: 0, empty: "not computed (grpo.beta = 0)",
   series: [["kl", "kl (k3)", "#d1495b"]]},
  {title: "Entropy", min: 0, series: [["entropy", "mean token entropy", "#6a4c93"]]},
  {title: "Gradient norm", min: 0, limit: d => cfg(d, "optim", "max_grad_norm") || null, limitLabel: "clip",
   series: [["grad_norm", "before clipping", "#e76f51"]]},
  {title: "Step time (s)", min: 0,
   series: [["step_s", "step", "#264653"], ["sample_s", "sampling", "#2a9d8f"], ["update_s", "update", "#e9c46a"]]},
  {title: "Loss and clipping", series: [["loss", "loss", "#264653"], ["clip_frac", "clip fraction", "#e76f51"]]},
];
const EVAL_COLOURS = {before: "#8a94a6", after: "#2a9d8f"};

const state = {data: null, signature: "", step: null, rollouts: null, rolloutsKey: "", selected: {}};

// --- small DOM helpers -----------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
function cfg(d, section, key) { return ((d.config || {})[section] || {})[key]; }
function num(v) { return typeof v === "number" && isFinite(v); }
function fmt(v, digits = 3) {
  if (!num(v)) return "–";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1000) return v.toFixed(0);
  if (a >= 100) return v.toFixed(1);
  if (a < 0.001) return v.toExponential(1);
  return String(Number(v.toPrecision(digits)));
}
function count(v) { return num(v) ? Math.round(v).toLocaleString("en-US") : "–"; }
function pct(v) { return num(v) ? (100 * v).toFixed(1) + "%" : "–"; }
function duration(s) {
  if (!num(s)) return "–";
  if (s < 90) return Math.round(s) + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function ago(seconds) {
  if (!num(seconds)) return "no files yet";
  return "updated " + (seconds < 5 ? "just now" : duration(seconds) + " ago");
}
function replace(node, ...children) { node.replaceChildren(...children.flat().filter(c => c)); }

// --- fetching --------------------------------------------------------------------------------
async function getJSON(url) {
  const response = await fetch(url, {cache: "no-store"});
  if (!response.ok) throw new Error(url + ": HTTP " + response.status);
  return response.json();
}

async function poll() {
  try {
    const d = await getJSON("/api/data");
    state.data = d;
    drawHeader(d);
    const signature = [d.history.length, d.updated, d.evals.length, d.rollout_steps.length, d.alarms.length].join("|");
    if (signature !== state.signature) {
      state.signature = signature;
      drawAlarms(d); drawTiles(d); drawCharts(d); drawPassRates(d); drawEvals(d); drawStepSelect(d); drawConfig(d);
      await refreshRollouts(d);
    }
    document.body.classList.remove("offline");
  } catch (err) {
    document.getElementById("updated").textContent = "cannot reach the watch server (" + err.message + ")";
  }
}

// --- header, alarms, tiles -------------------------------------------------------------------
function runStatus(d) {
  const h = d.history, last = h.length ? h[h.length - 1].step : 0;
  const names = d.evals.map(e => e.name);
  if (names.includes("after")) return ["finished", "finished"];
  const done = d.total_steps && last >= d.total_steps;
  if (done && !d.final_eval) return ["finished", "finished"];
  // files only: a run that wrote nothing for a long while may have stopped
  const quiet = d.now - (d.updated || d.now);
  const stepS = h.length ? h[h.length - 1].step_s || 0 : 0;
  if (quiet > Math.max(600, 5 * stepS)) return ["idle", "no file change for " + duration(quiet) + " (stopped?)"];
  if (done) return ["evaluating", "final evaluation"];
  if (!h.length) return ["running", d.final_eval ? "evaluating before training" : "starting"];
  return ["running", "training"];
}

function drawHeader(d) {
  document.getElementById("run-name").textContent = d.run_name;
  document.title = d.run_name + " · mlx-swe-rl watch";
  const [kind, label] = runStatus(d);
  const pill = document.getElementById("status");
  pill.className = "pill " + kind;
  pill.textContent = label;
  document.getElementById("model").textContent = "model: " + (d.model || "?");
  document.getElementById("run-dir").textContent = d.run_dir;
  document.getElementById("updated").textContent = ago(d.updated ? d.now - d.updated : null);
  const last = d.history.length ? d.history[d.history.length - 1].step : 0;
  document.getElementById("progress-bar").style.width = d.total_steps ? Math.min(100, 100 * last / d.total_steps) + "%" : "0";
}

function drawAlarms(d) {
  const box = document.getElementById("alarms");
  box.hidden = !d.alarms.length;
  if (!d.alarms.length) return replace(box);
  const items = d.alarms.slice().reverse().map(a =>
    el("li", {}, el("span", {class: "step", text: "step " + a.step}), el("span", {class: "name", text: a.name}),
       el("span", {text: a.message})));
  replace(box, el("h2", {text: "\u26A0 " + d.alarms.length + (d.alarms.length === 1 ? " alarm" : " alarms")}),
          el("ul", {}, items));
}

function series(h, key) { return h.filter(r => num(r.step) && num(r[key])).map(r => [r.step, r[key]]); }
function mean(values) { return values.length ? values.reduce((a, b) => a + b, 0) / values.length : NaN; }

function tile(label, value, note, noteClass) {
  return el("div", {class: "tile"}, el("div", {class: "label", text: label}), el("div", {class: "value", text: value}),
            el("div", {class: "note " + (noteClass || ""), text: note || "\u00A0"}));
}

function drawTiles(d) {
  const h = d.history, box = document.getElementById("tiles");
  if (!h.length) return replace(box, el("div", {class: "empty", text: "No training step recorded yet."}));
  const last = h[h.length - 1], first = h[0];
  const steps = h.map(r => r.step_s).filter(num), stepMean = mean(steps);
  const left = d.total_steps ? Math.max(0, d.total_steps - last.step) : 0;
  const change = (key) => {
    if (!num(last[key]) || !num(first[key]) || h.length < 2) return [null, ""];
    const diff = last[key] - first[key];
    return ["first " + fmt(first[key]) + " (" + (diff >= 0 ? "+" : "") + fmt(diff) + ")", diff > 0 ? "up" : diff < 0 ? "down" : ""];
  };
  const [rewardNote, rewardClass] = change("reward_mean");
  const [solveNote, solveClass] = change("solve_rate");
  const peak = Math.max(...h.map(r => r.peak_memory_gb).filter(num));
  const errored = h.filter(r => r.errored > 0);
  replace(box,
    tile("step", last.step + (d.total_steps ? " / " + d.total_steps : ""), left ? "about " + duration(left * stepMean) + " left" : ""),
    tile("reward mean", fmt(last.reward_mean), rewardNote, rewardClass),
    tile("solve rate", pct(last.solve_rate), solveNote, solveClass),
    tile("completion length", fmt(last.completion_len, 3), d.max_tokens ? "limit " + d.max_tokens + " tokens" : ""),
    tile("truncated", pct(last.truncation_rate), "zero-variance groups " + pct(last.zero_var_frac)),
    cfg(d, "grpo", "beta") === 0 ? tile("kl", "off", "grpo.beta = 0; entropy " + fmt(last.entropy))
      : tile("kl", fmt(last.kl), "entropy " + fmt(last.entropy)),
    tile("step time", duration(stepMean), "mean of " + steps.length + "; sampling " + pct(mean(h.map(r => r.sample_s).filter(num)) / stepMean)),
    tile("peak memory", isFinite(peak) ? fmt(peak) + " GB" : "–", "MLX peak, largest step"),
    num(last.tokens_total) ? tile("tokens sampled", count(last.tokens_total), count(last.sampled_tokens) + " this step" +
                                  (last.extra_tokens ? ", " + count(last.extra_tokens) + " on replacements" : "")) : null,
    errored.length ? tile("not scored", String(last.errored), errored.length + " step(s) had error verdicts, " +
                          errored.reduce((a, r) => a + r.errored, 0) + " episodes in all", "down") : null,
    tile("alarms", String(d.alarms.length), d.alarms.length ? "latest: " + d.alarms[d.alarms.length - 1].name : "none tripped",
         d.alarms.length ? "down" : ""));
}

// --- charts ----------------------------------------------------------------------------------
function niceStep(span, count) {
  const raw = span / Math.max(count, 1), power = Math.pow(10, Math.floor(Math.log10(raw)));
  const unit = raw / power;
  return power * (unit <= 1 ? 1 : unit <= 2 ? 2 : unit <= 2.5 ? 2.5 : unit <= 5 ? 5 : 10);
}
function ticks(lo, hi, count) {
  const step = niceStep(hi - lo || 1, count), out = [];
  for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + 1e-9 * step; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}
function ema(points, weight = 0.6) {
  let last = null;
  return points.map(([x, y]) => { last = last === null ? y : weight * last + (1 - weight) * y; return [x, last]; });
}

let tooltip = null;
function showTooltip(event, text) {
  if (!tooltip) { tooltip = el("div", {class: "tooltip"}); document.body.appendChild(tooltip); }
  tooltip.textContent = text;
  tooltip.style.display = "block";
  tooltip.style.left = (event.clientX + 14) + "px";
  tooltip.style.top = (event.clientY + 10) + "px";
}
function hideTooltip() { if (tooltip) tooltip.style.display = "none"; }

function drawCharts(d) {
  const box = document.getElementById("charts");
  replace(box, CHARTS.filter(spec => !spec.when || spec.when(d)).map(spec => {
    const card = el("div", {class: "card chart"});
    box.appendChild(card);  // measured below
    drawChart(card, spec, d);
    return card;
  }));
}

function drawChart(card, spec, d) {
  const h = d.history;
  const lines = spec.series.map(([key, label, colour]) => ({key, label, colour, points: series(h, key)}))
                           .filter(s => s.points.length);
  const latest = lines.length ? lines.map(s => fmt(s.points[s.points.length - 1][1])).join(" · ") : "";
  card.appendChild(el("h3", {}, el("span", {text: spec.title}), el("span", {class: "latest", text: latest})));
  const limit = spec.limit ? spec.limit(d) : null;
  card.appendChild(el("div", {class: "legend"},
    lines.map(s => el("span", {}, el("i", {style: null}), s.label)),
    num(limit) ? el("span", {}, el("i", {class: "lim"}), spec.limitLabel + " " + fmt(limit)) : null));
  // legend swatch colours through the CSSOM (inline style attributes are refused by the CSP)
  const swatches = card.querySelectorAll(".legend i");
  lines.forEach((s, i) => { swatches[i].style.background = s.colour; });
  if (num(limit)) swatches[lines.length].style.background = "#d1495b";
  if (!lines.length) {
    card.appendChild(el("div", {class: "empty", text: h.length ? (spec.empty || "no values recorded") : "waiting for the first step"}));
    return;
  }
  const W = Math.max(card.clientWidth - 28, 300), H = 190, m = {l: 46, r: 14, t: 8, b: 24};
  const xs = lines.flatMap(s => s.points.map(p => p[0])), ys = lines.flatMap(s => s.points.map(p => p[1]));
  // every chart spans the run's steps, so one step lines up across charts
  const allSteps = h.map(r => r.step).filter(num);
  let x0 = Math.min(...allSteps, ...xs), x1 = Math.max(...allSteps, ...xs);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  let y0 = spec.min !== undefined ? Math.min(spec.min, ...ys) : Math.min(...ys);
  let y1 = spec.max !== undefined ? Math.max(spec.max, ...ys) : Math.max(...ys, num(limit) ? limit : -Infinity);
  if (num(limit)) y1 = Math.max(y1, limit * 1.05);
  if (y0 === y1) { y1 = y0 + (Math.abs(y0) || 1); }
  if (spec.max === undefined) y1 += (y1 - y0) * 0.06;
  const X = v => m.l + (v - x0) / (x1 - x0) * (W - m.l - m.r);
  const Y = v => H - m.b - (v - y0) / (y1 - y0) * (H - m.t - m.b);
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, width: W, height: H});
  for (const t of ticks(y0, y1, 4)) {
    root.appendChild(svg("line", {class: "grid", x1: m.l, x2: W - m.r, y1: Y(t), y2: Y(t)}));
    root.appendChild(svg("text", {x: m.l - 6, y: Y(t) + 3.5, "text-anchor": "end"}, spec.percent ? Math.round(t * 100) + "%" : fmt(t)));
  }
  const xt = ticks(x0, x1, Math.min(8, Math.max(2, Math.round((W - 80) / 60)))).filter(t => Number.isInteger(t));
  for (const t of xt) root.appendChild(svg("text", {x: X(t), y: H - 6, "text-anchor": "middle"}, String(t)));
  root.appendChild(svg("line", {class: "axis", x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b}));
  for (const a of d.alarms) {
    if (num(a.step) && a.step >= x0 && a.step <= x1)
      root.appendChild(svg("line", {class: "alarm-mark", x1: X(a.step), x2: X(a.step), y1: m.t, y2: H - m.b}));
  }
  if (num(limit)) {
    root.appendChild(svg("line", {class: "limit", x1: m.l, x2: W - m.r, y1: Y(limit), y2: Y(limit)}));
    root.appendChild(svg("text", {x: W - m.r, y: Y(limit) - 4, "text-anchor": "end"}, spec.limitLabel + " " + fmt(limit)));
  }
  const dots = xs.length / lines.length <= 80;
  for (const s of lines) {
    const trend = spec.smooth && s.points.length > 2 ? ema(s.points) : s.points;
    const path = trend.map(([x, y], i) => (i ? "L" : "M") + X(x).toFixed(1) + " " + Y(y).toFixed(1)).join(" ");
    root.appendChild(svg("path", {d: path, fill: "none", stroke: s.colour, "stroke-width": 2, "stroke-linejoin": "round"}));
    if (dots || spec.smooth) {
      for (const [x, y] of s.points)
        root.appendChild(svg("circle", {cx: X(x), cy: Y(y), r: spec.smooth ? 2.6 : 2.2, fill: s.colour,
                                        "fill-opacity": spec.smooth ? 0.4 : 0.9}));
    }
  }
  const guide = svg("line", {class: "hover", x1: 0, x2: 0, y1: m.t, y2: H - m.b, visibility: "hidden"});
  root.appendChild(guide);
  const catcher = svg("rect", {x: m.l, y: m.t, width: W - m.l - m.r, height: H - m.t - m.b, fill: "transparent"});
  const steps = [...new Set(xs)].sort((a, b) => a - b);
  catcher.addEventListener("mousemove", event => {
    const box = root.getBoundingClientRect();
    const at = x0 + (event.clientX - box.left - m.l) / (W - m.l - m.r) * (x1 - x0);
    const step = steps.reduce((best, s) => Math.abs(s - at) < Math.abs(best - at) ? s : best, steps[0]);
    guide.setAttribute("x1", X(step)); guide.setAttribute("x2", X(step)); guide.setAttribute("visibility", "visible");
    const record = h.find(r => r.step === step) || {};
    const text = ["step " + step, ...lines.map(s => s.label + ": " + (spec.percent ? pct(record[s.key]) : fmt(record[s.key], 4)))];
    for (const a of d.alarms.filter(a => a.step === step)) text.push("\u26A0 " + a.name);
    showTooltip(event, text.join("\n"));
  });
  catcher.addEventListener("mouseleave", () => { guide.setAttribute("visibility", "hidden"); hideTooltip(); });
  root.appendChild(catcher);
  card.appendChild(root);
}

// --- pass-rate estimates ---------------------------------------------------------------------
const PASS_RATE_ROWS = 40;
function drawPassRates(d) {
  const box = document.getElementById("pass-rates"), rates = d.pass_rates;
  box.hidden = !rates;
  if (!rates) return replace(box);  // a run made before pass rates were kept
  const rows = rates.puzzles, band = (lo, hi) => rows.filter(r => r.mean > lo && r.mean <= hi).length;
  const order = cfg(d, "train", "order") || "epoch";
  const note = rows.length + " puzzles after step " + rates.step + ": " + band(0.1, 0.9) + " with an estimate " +
    "between 10% and 90%, " + band(0.9, 1) + " above, " + band(-1, 0.1) + " below \u00B7 order: " + order +
    (order === "learnable" ? " (the most learnable first)" : " (shown, not used)") + " \u00B7 decay " + rates.decay;
  const table = el("table", {},
    el("thead", {}, el("tr", {}, ["puzzle", "pass rate", "\u00B1 sd", "outcomes", "last sampled"]
      .map((c, i) => el("th", {class: i ? "num" : null, text: c})))),
    el("tbody", {}, rows.slice(0, PASS_RATE_ROWS).map(r => el("tr", {}, el("td", {text: r.id}),
      el("td", {class: "num", text: pct(r.mean)}), el("td", {class: "num ci", text: pct(r.sd)}),
      el("td", {class: "num", text: fmt(r.outcomes, 3)}),
      el("td", {class: "num", text: r.last_step ? "step " + r.last_step : "never"})))));
  replace(box, el("h2", {text: "Pass-rate estimates"}),
          el("div", {class: "card"}, el("h3", {text: note}), table,
             rows.length > PASS_RATE_ROWS ? el("div", {class: "empty", text: (rows.length - PASS_RATE_ROWS) +
               " more in passrates.json"}) : null));
}

// --- evaluations -----------------------------------------------------------------------------
function evalLabel(e) {
  const k = (e.settings || {}).samples || 1;
  return e.name + " \u00B7 " + (k > 1 ? "avg@" + k : "greedy pass@1");
}
function evalColour(name, i, n) {
  if (EVAL_COLOURS[name]) return EVAL_COLOURS[name];
  const shades = ["#9ab6d3", "#6f96c0", "#3a6ea5", "#2b527c"];
  return shades[Math.min(shades.length - 1, Math.round(i / Math.max(n - 1, 1) * (shades.length - 1)))];
}
function totalKey(t) { return (t.tier !== undefined ? t.tier : "family " + t.family) + " / " + t.split; }

function drawEvals(d) {
  const box = document.getElementById("evals");
  if (!d.evals.length) {
    const wanted = d.final_eval ? "eval-before.json appears when the evaluation before training finishes." :
      "train.final_eval is off and no periodic evaluation (train.eval_every) has run.";
    return replace(box, el("div", {class: "empty", text: "No evaluation yet: " + wanted}));
  }
  let keys = [];
  for (const e of d.evals) for (const t of e.totals) if (!keys.includes(totalKey(t))) keys.push(totalKey(t));
  // with one tier the "all" rows repeat that tier's: leave them out
  const tiers = new Set(d.evals.flatMap(e => e.totals.filter(t => t.tier !== undefined && t.tier !== "all").map(t => t.tier)));
  if (tiers.size === 1) keys = keys.filter(k => !k.startsWith("all / "));
  const find = (e, key) => e.totals.find(t => totalKey(t) === key);
  const steps = d.evals.filter(e => e.name.startsWith("step-"));
  const colour = e => evalColour(e.name, steps.indexOf(e), steps.length);
  const table = el("table", {},
    el("thead", {}, el("tr", {}, el("th", {text: "tier / split"}), el("th", {class: "num", text: "puzzles"}),
      d.evals.map(e => el("th", {class: "num"}, el("span", {class: "swatch", "data-colour": colour(e)}), evalLabel(e))))),
    el("tbody", {}, keys.map(key => el("tr", {}, el("td", {text: key}),
      el("td", {class: "num", text: String((find(d.evals[d.evals.length - 1], key) || find(d.evals[0], key) || {}).puzzles || "")}),
      d.evals.map(e => {
        const t = find(e, key);
        if (!t) return el("td", {class: "num", text: "–"});
        const ci = t.ci95 || [];
        return el("td", {class: "num"}, pct(t["pass@1"]), " ", el("span", {class: "ci", text: "[" + pct(ci[0]) + ", " + pct(ci[1]) + "]"}));
      })))));
  const left = el("div", {class: "card"}, el("h3", {text: "Pass rate per tier and split, with 95% bootstrap intervals"}), table);
  const right = el("div", {class: "card"}, el("h3", {text: "Before / after (dots: pass rate, bars: 95% CI)"}), ciChart(d.evals, keys, find, colour));
  const parts = [el("div", {class: "evals"}, left, right)];
  const changed = d.evals.filter(e => e.change_vs_before);
  if (changed.length) {
    const e = changed[changed.length - 1];
    parts.push(el("div", {class: "card"},
      el("h3", {text: "Paired change from before training (" + e.name + "), per puzzle, 95% CI"}),
      el("table", {}, el("thead", {}, el("tr", {}, ["split", "puzzles", "before", "after", "change", "95% CI", "up", "down"]
        .map((c, i) => el("th", {class: i ? "num" : null, text: c})))),
        el("tbody", {}, Object.entries(e.change_vs_before).map(([split, c]) => {
          const ci = c.ci95 || [];
          const sign = num(ci[0]) && ci[0] > 0 ? "pos" : num(ci[1]) && ci[1] < 0 ? "neg" : null;
          return el("tr", {}, el("td", {text: split}), el("td", {class: "num", text: String(c.puzzles)}),
            el("td", {class: "num", text: pct(c.before)}), el("td", {class: "num", text: pct(c.after)}),
            el("td", {class: "num"}, el("span", {class: sign, text: (c.change >= 0 ? "+" : "") + (num(c.change) ? (100 * c.change).toFixed(1) : "–") + " pts"})),
            el("td", {class: "num ci", text: "[" + signedPts(ci[0]) + ", " + signedPts(ci[1]) + "]"}),
            el("td", {class: "num", text: String(c.improved)}), el("td", {class: "num", text: String(c.worsened)}));
        })))));
  }
  const pc = d.puzzle_changes;
  if (pc && (pc.improved.length || pc.worsened.length)) {
    parts.push(el("div", {class: "card"}, el("h3", {text: "Puzzles that changed from " + pc.from + " to " + pc.to}),
      el("div", {}, el("span", {class: "pos", text: "up (" + pc.improved.length + "): "}), pc.improved.join(", ") || "none"),
      el("div", {}, el("span", {class: "neg", text: "down (" + pc.worsened.length + "): "}), pc.worsened.join(", ") || "none")));
  }
  replace(box, parts);
  box.querySelectorAll(".swatch").forEach(s => { s.style.background = s.dataset.colour; });
}
function signedPts(v) { return num(v) ? (v >= 0 ? "+" : "") + (100 * v).toFixed(1) : "–"; }

function ciChart(evals, keys, find, colour) {
  const row = 16 * Math.max(evals.length, 1) + 14, W = 520, m = {l: 120, r: 16, t: 8, b: 24};
  const H = m.t + m.b + row * keys.length;
  const X = v => m.l + v * (W - m.l - m.r);
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, width: "100%", height: H});
  for (const t of [0, 0.25, 0.5, 0.75, 1]) {
    root.appendChild(svg("line", {class: "grid", x1: X(t), x2: X(t), y1: m.t, y2: H - m.b}));
    root.appendChild(svg("text", {x: X(t), y: H - 8, "text-anchor": "middle"}, Math.round(100 * t) + "%"));
  }
  keys.forEach((key, k) => {
    const top = m.t + k * row;
    root.appendChild(svg("text", {x: m.l - 8, y: top + row / 2 + 3, "text-anchor": "end"}, key));
    evals.forEach((e, i) => {
      const t = find(e, key);
      if (!t || !num(t["pass@1"])) return;
      const y = top + 8 + i * 16, c = colour(e), ci = t.ci95 || [];
      if (num(ci[0]) && num(ci[1]))
        root.appendChild(svg("line", {x1: X(ci[0]), x2: X(ci[1]), y1: y, y2: y, stroke: c, "stroke-width": 3, "stroke-linecap": "round", "stroke-opacity": 0.45}));
      root.appendChild(svg("circle", {cx: X(t["pass@1"]), cy: y, r: 4.5, fill: c}));
    });
  });
  return root;
}

// --- rollouts --------------------------------------------------------------------------------
function drawStepSelect(d) {
  const select = document.getElementById("step-select");
  const steps = d.rollout_steps;
  const latest = steps.length ? steps[steps.length - 1].step : null;
  replace(select, el("option", {value: "", text: "latest" + (latest !== null ? " (step " + latest + ")" : "")}),
          steps.slice().reverse().map(s => el("option", {value: String(s.step),
            text: "step " + s.step + " \u00B7 " + s.solved + "/" + s.completions + " solved" +
                  (s.errored ? " \u00B7 " + s.errored + " not scored" : "")})));
  select.value = state.step === null ? "" : String(state.step);
}

async function refreshRollouts(d) {
  const steps = d.rollout_steps;
  const step = state.step !== null ? state.step : steps.length ? steps[steps.length - 1].step : null;
  const box = document.getElementById("rollouts");
  if (step === null) return replace(box, el("div", {class: "empty", text: "No rollouts recorded yet (rollouts.jsonl)."}));
  const count = (steps.find(s => s.step === step) || {}).completions;
  const key = step + "|" + count;
  if (key === state.rolloutsKey) return;
  const data = await getJSON("/api/rollouts?step=" + encodeURIComponent(step));
  state.rolloutsKey = key;
  state.rollouts = data;
  drawRollouts(data);
}

function drawRollouts(data) {
  const box = document.getElementById("rollouts");
  if (!data.puzzles.length) return replace(box, el("div", {class: "empty", text: "No rollouts for step " + data.step + "."}));
  replace(box, data.puzzles.map(p => puzzleCard(p, data.step)));
}

function puzzleCard(p, step) {
  const id = step + ":" + p.id;
  if (state.selected[id] === undefined) {
    const firstSolved = p.rollouts.findIndex(r => r.solved);
    state.selected[id] = firstSolved >= 0 ? firstSolved : 0;
  }
  const card = el("div", {class: "card puzzle"});
  const detail = el("div");
  const chips = el("div", {class: "chips"}, p.rollouts.map((r, i) => el("button", {
    type: "button", class: "chip " + (r.solved ? "ok" : "bad") + (i === state.selected[id] ? " sel" : ""),
    title: (r.error ? "not scored (puzzle error)" : r.solved ? "solved" : "not solved") + (r.truncated ? ", truncated" : ""),
    onclick: () => { state.selected[id] = i; chips.querySelectorAll(".chip").forEach((c, j) => c.classList.toggle("sel", j === i));
                     replace(detail, rolloutDetail(p, p.rollouts[i])); }},
    "#" + (i + 1) + " " + (r.solved ? "\u2713" : "\u2717") + (r.reward !== 0 && r.reward !== 1 ? " " + fmt(r.reward, 2) : ""),
    r.truncated ? el("span", {class: "t", text: "cut"}) : null)));
  card.append(
    el("div", {class: "puzzle-head"}, el("span", {class: "pid", text: p.id}), p.tier ? el("span", {class: "tier", text: p.tier}) : null,
       el("span", {class: "score", text: p.solved + "/" + p.rollouts.length + " solved \u00B7 mean reward " + fmt(p.mean_reward)})),
    p.description ? el("div", {class: "desc", text: p.description}) : null, chips, detail);
  replace(detail, rolloutDetail(p, p.rollouts[state.selected[id]]));
  return card;
}

function rolloutDetail(p, r) {
  const meta = [num(r.tokens) ? r.tokens + " tokens" : null, r.truncated ? "hit the token limit" : null].filter(Boolean);
  const left = el("div", {}, el("h4", {}, "completion", meta.map(m => el("span", {class: "badge" + (m.startsWith("hit") ? " warn" : ""), text: m}))),
                  el("pre", {text: r.completion || "(empty)"}));
  let right;
  if (r.code === null || r.code === undefined) {
    right = el("div", {}, el("h4", {text: "extracted code"}), el("div", {class: "empty", text: "No code found in the response: a format failure."}));
  } else if (r.diff) {
    right = el("div", {}, el("h4", {text: "diff against the buggy code"}),
      r.diff.length ? el("pre", {class: "diff"}, r.diff.map(line => el("span", {
        class: line.startsWith("+++") || line.startsWith("---") ? "meta" : line.startsWith("@@") ? "hunk" :
               line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : null, text: line + "\n"})))
        : el("div", {class: "empty", text: "The code is the buggy code unchanged."}));
  } else {
    right = el("div", {}, el("h4", {}, "extracted code", el("span", {class: "badge", text: "puzzle not found: no diff"})),
               el("pre", {text: r.code}));
  }
  let tests;
  if (!Array.isArray(r.tests)) tests = el("div", {class: "empty", text: "Test outcomes were not recorded in this run's rollouts.jsonl."});
  else if (!r.tests.length) tests = el("div", {class: "empty", text: r.code === null ? "Not run: there was no code." : "No test outcomes."});
  else tests = el("div", {}, el("h4", {text: "tests: " + r.tests.filter(t => t.status === "passed").length + " of " + r.tests.length + " passed"}),
    r.tests.map((t, i) => el("div", {class: "test"}, el("span", {class: "status " + t.status, text: t.status}),
      el("span", {class: "muted", text: "#" + (i + 1)}), el("span", {class: "d", text: t.detail || ""}))));
  // a multi-turn episode: its earlier answers and the feedback each got, above the last answer
  const earlier = Array.isArray(r.turns) && r.turns.length > 1 ? el("div", {class: "turns"},
    r.turns.slice(0, -1).map((t, i) => el("div", {class: "turn"},
      el("h4", {}, "answer " + (i + 1), el("span", {class: "badge", text: t.public_ok ? "public tests passed" : "public tests failed"})),
      el("pre", {text: t.completion || "(empty)"}),
      el("h4", {text: "feedback shown"}), el("pre", {class: "feedback", text: t.feedback || "(none)"}))),
    el("h4", {text: "answer " + r.turns.length + " (last)"})) : null;
  // an error verdict: the puzzle could not be scored, so the answer got reward 0 without being judged
  const error = r.error ? el("div", {class: "error-verdict"}, el("h4", {text: "not scored: the puzzle could not be scored"}),
                             el("pre", {text: r.error})) : null;
  return [error, earlier, el("div", {class: "detail"}, left, right), el("div", {class: "tests"}, tests)].filter(Boolean);
}

function drawConfig(d) {
  const pre = document.getElementById("config");
  if (pre.textContent !== d.config_text) pre.textContent = d.config_text || "(no config.yaml)";
}

// --- wiring ----------------------------------------------------------------------------------
function chooseStep(value) {
  state.step = value === "" ? null : Number(value);
  state.rolloutsKey = "";
  if (state.data) { drawStepSelect(state.data); refreshRollouts(state.data); }
}
document.getElementById("step-select").addEventListener("change", e => chooseStep(e.target.value));
function shiftStep(delta) {
  if (!state.data || !state.data.rollout_steps.length) return;
  const steps = state.data.rollout_steps.map(s => s.step);
  const current = state.step === null ? steps[steps.length - 1] : state.step;
  const i = Math.max(0, Math.min(steps.length - 1, steps.indexOf(current) + delta));
  chooseStep(i === steps.length - 1 ? "" : String(steps[i]));
}
document.getElementById("prev-step").addEventListener("click", () => shiftStep(-1));
document.getElementById("next-step").addEventListener("click", () => shiftStep(1));
let resizeTimer = null;
window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(() => state.data && drawCharts(state.data), 150); });
poll();
setInterval(poll, POLL_MS);
