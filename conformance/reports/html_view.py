"""A trace you can look at: one self-contained HTML page per run or counterexample.

`render_html` turns a trace, its recorded steps and the violations found into one HTML page
with everything inline (the data as JSON, the CSS and the script): no network, no external
scripts or fonts, so the page opens from a CI artifact or an e-mail attachment as it is.

The page shows, step by step: the queue lanes (each request in waiting / running / swapped /
finished), the GPU and CPU block maps (which request holds which block, reference counts,
shared blocks marked, blocks whose reference count disagrees with the tables flagged), the
step's scheduled tokens, swap and copy maps, the reasons behind every decision, and every
violated invariant highlighted at its step with its statement and message; for a pipelined run
(``pipeline_depth`` > 0), which step's outcome each step processes, which steps are still in
flight, and which outcome each finish came from. Where the snapshots show them, the block map
marks the blocks a connector load writes (and those it fails to fill), those a send reads (a
finished request's delayed free) and those held without a table, counts the tables of KV cache
groups 1.. beside group 0's (the Sequences table lists them, ``·`` for a null block), and a card
lists the transfers in flight and those the step's outcome reported done, the encoder cache's
entries and holders, and a paused engine's state. Step through it
with the arrow keys (Home / End, ``v`` for the next violation, ``s`` for the snapshot phase)
or with the buttons; ``page.html#step=N`` opens it at step N, and otherwise it opens at the
first violating step, with the violated invariants' statements beside the step number.

The page is a pure function of its inputs; `write_html` writes it.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from conformance.reports.explain import explain_step
from spec.catalogue import Violation
from spec.connector import TransferView
from spec.kv_groups import NULL_BLOCK
from spec.observation import Snapshot, StepRecord
from spec.trace import Trace

VIEW_VERSION = 3  # 2: pipeline_depth, per step and per finish the outcome it belongs to; 3: the extra state


def _transfers(transfers: Mapping[str, TransferView] | None) -> dict[str, Any] | None:
    if transfers is None:
        return None
    return {
        rid: {"kind": t.kind, "blocks": list(t.blocks), "tokens": t.tokens, "async": t.load_async,
              "failed": list(t.failed)}
        for rid, t in sorted(transfers.items())
    }


def _extra_state(snap: Snapshot) -> dict[str, Any]:
    """What a snapshot holds beyond queues and pools, each part None where it was not observed:
    connector transfers in flight and those reported done (a load into its blocks, a send holding a
    finished request's blocks), blocks held without a table, the block tables of KV cache groups
    1.., the encoder cache and the pause state."""
    encoder = None
    if snap.encoder_cache is not None:
        encoder = {h: {"size": e.size, "users": sorted(e.users)} for h, e in sorted(snap.encoder_cache.items())}
    groups = None
    if snap.group_tables is not None:
        groups = {sid: [list(t) for t in tables] for sid, tables in snap.group_tables.items()}
    return {
        "transfers": _transfers(snap.kv_transfers),
        "reported": _transfers(snap.kv_reported),
        "fenced": list(snap.gpu_fenced) if snap.gpu_fenced is not None else None,
        "cache_holds": list(snap.gpu_cache_holds) if snap.gpu_cache_holds is not None else None,
        "group_tables": groups,
        "encoder_cache": encoder,
        "encoder_free": snap.encoder_free,
        "pause_state": snap.pause_state,
    }


def _snapshot(snap: Snapshot | None) -> dict[str, Any] | None:
    if snap is None:
        return None
    seqs = None
    if snap.seqs is not None:
        seqs = {
            sid: {
                "request": v.request_id,
                "status": v.status.value,
                "tokens": v.num_tokens,
                "computed": v.num_computed,
                "blocks": list(v.blocks) if v.blocks is not None else None,
                "device": v.device,
            }
            for sid, v in snap.seqs.items()
        }
    return {
        "statuses": {k: s.value for k, s in snap.statuses.items()} if snap.statuses is not None else None,
        "seqs": seqs,
        "waiting": list(snap.waiting) if snap.waiting is not None else None,
        "running": list(snap.running) if snap.running is not None else None,
        "swapped": list(snap.swapped) if snap.swapped is not None else None,
        "gpu_ref_counts": list(snap.gpu_ref_counts) if snap.gpu_ref_counts is not None else None,
        "cpu_ref_counts": list(snap.cpu_ref_counts) if snap.cpu_ref_counts is not None else None,
        "gpu_free": snap.gpu_free,
        "cpu_free": snap.cpu_free,
        **_extra_state(snap),
    }


def _statement(invariant_id: str) -> tuple[str, str]:
    from spec.catalogue import get

    try:
        inv = get(invariant_id)
    except KeyError:
        return "", ""
    return inv.statement, inv.category


def view_data(
    trace: Trace, records: Sequence[StepRecord], violations: Iterable[Violation], title: str | None = None
) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data (embedded in the page as it is)."""
    name = title or str(trace.meta.get("name", "trace"))
    found = []
    for v in violations:
        statement, category = _statement(v.invariant_id)
        found.append(
            {"id": v.invariant_id, "step": v.step, "message": v.message, "statement": statement, "category": category}
        )
    steps = []
    depth = trace.config.pipeline_depth
    for r in records:
        # Pipelined (docs/ASYNC.md): this step's update processes the outcome of step r.step - depth;
        # a finish from an abort or a refusal at the door belongs to no outcome.
        outcome_of = trace.outcome_step(r.step)
        at_once = set(r.aborted) | set(r.refused)
        steps.append({
            "step": r.step,
            "added": [q.request_id for q in r.added],
            "aborted": list(r.aborted),
            "stopped": sorted(r.stopped),
            "output": r.output.to_dict(),
            "outcome_of": outcome_of,
            "in_flight": list(range(max(r.step - depth + 1, 0), r.step + 1)) if depth else [],
            "finished": [
                {"request": f.request_id, "status": f.status.value, "reason": f.reason.text() if f.reason else None,
                 "outcome_of": None if f.request_id in at_once else outcome_of}
                for f in r.finished
            ],
            "explain": explain_step(r.output, r.finished),
            "before": _snapshot(r.before),
            "mid": _snapshot(r.mid),
            "after": _snapshot(r.after),
        })
    return {
        "version": VIEW_VERSION,
        "title": name,
        "config": trace.config.to_dict(),
        "pipeline_depth": depth,
        "null_block": NULL_BLOCK,  # a KV cache group's table position without a real block
        "watermark_blocks": trace.config.watermark_blocks,
        "requests": [{**a.request.to_dict(), "arrival_step": a.step} for a in trace.arrivals],
        "steps": steps,
        "violations": found,
    }


def _json_for_script(data: Any) -> str:
    """JSON that cannot end the <script> element it sits in (nor open a comment)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace(
        "\u2028", "\\u2028"
    ).replace("\u2029", "\\u2029")


def render_html(
    trace: Trace, records: Sequence[StepRecord], violations: Iterable[Violation] = (), title: str | None = None
) -> str:
    """The page, as one string (pure: the same inputs give the same page)."""
    data = view_data(trace, records, violations, title)
    page_title = f"kvsched · {data['title']}"
    return (
        _TEMPLATE.replace("__TITLE__", html.escape(page_title))
        .replace("__CSS__", _CSS)
        .replace("__JS__", _JS)
        .replace("__DATA__", _json_for_script(data))
    )


def write_html(
    path: str | Path,
    trace: Trace,
    records: Sequence[StepRecord],
    violations: Iterable[Violation] = (),
    title: str | None = None,
) -> Path:
    """Write the page to ``path`` (parent folders are created); returns the path. The path is made
    absolute, and no folder on it is followed if it is a link (`spec.safe_write`): the page is
    written in the adapter's process, into a folder the adapter can reach."""
    from spec.safe_write import write_no_links

    path = Path(os.path.abspath(path))
    return write_no_links(path, render_html(trace, records, violations, title).encode("utf-8", "backslashreplace"))


def write_run_view(path: Path | str, trace: Trace, result: Any) -> Path | None:
    """The HTML view of a checked run (`conformance.runner.driver.TraceResult`); None when it cannot be
    written (the page is a convenience; the JSON trace is the evidence, so a failure here never
    costs a finding)."""
    try:
        return write_html(Path(path), trace, result.records, result.violations)
    except Exception:  # noqa: BLE001
        return None


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>__TITLE__</title>
<style>__CSS__</style>
</head>
<body>
<header>
  <div class="head-row">
    <h1 id="title"></h1>
    <div id="verdict"></div>
  </div>
  <div id="config" class="config"></div>
</header>
<nav id="controls" aria-label="step controls">
  <button id="btn-first" title="first step (Home)">&#xAB; first</button>
  <button id="btn-prev" title="previous step (&#x2190;)">&#x25C0; prev</button>
  <span id="step-label" class="step-label" aria-live="polite"></span>
  <span id="step-violation" class="step-violation" hidden></span>
  <button id="btn-next" title="next step (&#x2192;)">next &#x25B6;</button>
  <button id="btn-last" title="last step (End)">last &#xBB;</button>
  <button id="btn-violation" class="warn" title="next violation (v)">&#x26A0; next violation</button>
  <span class="phase" role="group" aria-label="snapshot">
    <span class="muted">state:</span>
    <button data-phase="before" title="before schedule() (s cycles)">before</button>
    <button data-phase="mid" title="right after schedule()">after schedule</button>
    <button data-phase="after" title="after the outcome and frees">after step</button>
  </span>
  <span class="muted keys">keys: &#x2190; &#x2192; Home End, v violation, s state</span>
</nav>
<div id="timeline" class="timeline" aria-label="steps"></div>
<main>
  <section id="violation-panel" class="violation-panel" hidden></section>
  <div class="grid">
    <section class="card lanes-card">
      <h2>Queues</h2>
      <div id="lanes"></div>
    </section>
    <section class="card">
      <h2>This step</h2>
      <div id="events"></div>
      <h3>Scheduled</h3>
      <div id="scheduled"></div>
      <h3>Swap and copy maps</h3>
      <div id="maps"></div>
    </section>
    <section class="card wide">
      <h2 id="gpu-title">GPU blocks</h2>
      <div id="gpu-map" class="blockmap"></div>
      <h2 id="cpu-title">CPU (swap) blocks</h2>
      <div id="cpu-map" class="blockmap"></div>
      <div class="legend">
        <span><span class="blk sample free"></span>free</span>
        <span><span class="blk sample shared"></span>shared (reference count &gt; 1)</span>
        <span><span class="blk sample bad"></span>reference count disagrees with the tables</span>
        <span><span class="blk sample moved"></span>in this step's swap / copy map</span>
        <span><span class="xfer-sample load">load</span>a connector load writing it</span>
        <span><span class="xfer-sample send">send</span>a send reading it (its free is delayed)</span>
        <span><span class="xfer-sample failed">failed</span>the load fails to fill it</span>
        <span><span class="xfer-sample held">held</span>held without a table (in-flight writes, a cache)</span>
      </div>
    </section>
    <section class="card wide" id="extra-card" hidden>
      <h2 id="extra-title">Connector, held blocks, encoder cache, pause</h2>
      <div id="extra"></div>
    </section>
    <section class="card wide">
      <h2>Why (reasons)</h2>
      <ul id="reasons" class="reasons"></ul>
    </section>
    <section class="card wide">
      <h2>Sequences</h2>
      <div id="seqs"></div>
    </section>
  </div>
</main>
<script id="kvsched-data" type="application/json">__DATA__</script>
<script>__JS__</script>
</body>
</html>
"""

_CSS = """
:root { --bg:#f6f7f9; --card:#fff; --ink:#1d2330; --muted:#6b7385; --line:#dde1e8;
  --bad:#c62828; --bad-bg:#fdecea; --ok:#2e7d32; --accent:#3457d5; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
header { background:#1d2330; color:#fff; padding:12px 20px 10px; }
.head-row { display:flex; align-items:center; gap:16px; flex-wrap:wrap; }
h1 { font-size:18px; margin:0; font-weight:600; }
h2 { font-size:13px; text-transform:uppercase; letter-spacing:.06em; color:var(--muted); margin:0 0 8px; }
h3 { font-size:12px; color:var(--muted); margin:12px 0 4px; font-weight:600; }
.config { color:#b8c0d4; font-size:12px; margin-top:4px; font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
#verdict { font-weight:600; padding:3px 10px; border-radius:12px; font-size:13px; }
#verdict.ok { background:#e3f4e4; color:var(--ok); }
#verdict.bad { background:var(--bad); color:#fff; }
nav { position:sticky; top:0; z-index:5; display:flex; align-items:center; gap:6px; flex-wrap:wrap;
  padding:8px 20px; background:#fff; border-bottom:1px solid var(--line); }
button { font:inherit; font-size:13px; padding:4px 10px; border:1px solid var(--line); border-radius:6px;
  background:#fff; color:var(--ink); cursor:pointer; }
button:hover { border-color:var(--accent); }
button:focus-visible { outline:2px solid var(--accent); outline-offset:1px; }
button.warn { color:var(--bad); border-color:#f0b4b4; }
button.on { background:var(--accent); border-color:var(--accent); color:#fff; }
button:disabled { opacity:.4; cursor:default; }
.step-label { min-width:150px; text-align:center; font-weight:700; font-size:15px; padding:3px 10px; border-radius:6px; }
.step-label.violating { background:var(--bad); color:#fff; }
.phase { margin-left:12px; display:inline-flex; gap:4px; align-items:center; }
.muted { color:var(--muted); }
.keys { margin-left:auto; font-size:12px; }
.timeline { display:flex; flex-wrap:wrap; gap:2px; padding:8px 20px; background:#fff; border-bottom:1px solid var(--line); }
.tick { min-width:22px; height:22px; padding:0 3px; font-size:10px; line-height:22px; text-align:center;
  border-radius:3px; background:#e8ebf1; color:var(--muted); cursor:pointer; user-select:none; }
.tick.has-prefill { background:#dbe4ff; }
.tick.has-preempt { background:#ffe7c2; }
.tick.violating { background:var(--bad); color:#fff; font-weight:700; }
.step-violation { color:var(--bad); font-weight:600; max-width:48em; overflow:hidden; text-overflow:ellipsis; white-space:nowrap; }
.tick.current { outline:2px solid var(--ink); outline-offset:1px; color:var(--ink); font-weight:700; }
.tick.violating.current { color:#fff; }
main { padding:14px 20px 40px; }
.grid { display:grid; grid-template-columns: minmax(320px, 1fr) minmax(320px, 1fr); gap:14px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:12px 14px; min-width:0; }
.card.wide { grid-column: 1 / -1; }
.violation-panel { background:var(--bad-bg); border:2px solid var(--bad); border-radius:8px; padding:10px 14px; margin-bottom:14px; }
.violation-panel h2 { color:var(--bad); }
.violation { margin:6px 0; }
.violation .vid { font-weight:700; color:var(--bad); font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.violation .statement { font-weight:600; }
.violation .message { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size:12.5px; white-space:pre-wrap; margin:4px 0 0; padding-left:20px; }
.lane { display:flex; align-items:flex-start; gap:8px; padding:6px 0; border-top:1px dashed var(--line); }
.lane:first-child { border-top:none; }
.lane-name { width:78px; flex:none; font-weight:600; color:var(--muted); font-size:12px; padding-top:3px; }
.lane-items { display:flex; flex-wrap:wrap; gap:5px; min-height:24px; }
.chip { display:inline-flex; align-items:center; gap:4px; padding:2px 8px; border-radius:12px; font-size:12.5px;
  font-weight:600; border:1px solid rgba(0,0,0,.12); color:#1d2330; }
.chip small { font-weight:400; color:#3b4252; }
.chip.gone { opacity:.55; }
.chip.new { box-shadow:0 0 0 2px var(--accent); }
.empty { color:var(--muted); font-size:12px; font-style:italic; padding-top:3px; }
.blockmap { display:grid; grid-template-columns: repeat(auto-fill, minmax(64px, 1fr)); gap:4px; margin-bottom:12px; }
.blk { position:relative; height:50px; border-radius:5px; border:1px solid rgba(0,0,0,.15); padding:2px 4px;
  font-size:11px; line-height:1.2; overflow:hidden; background:#fff; }
.blk .bid { color:#4a5263; font-size:10px; }
.blk .owner { font-weight:700; font-size:12px; white-space:nowrap; overflow:hidden; text-overflow:ellipsis; }
.blk .rc { position:absolute; right:3px; top:2px; font-size:10px; font-weight:700; }
.blk.free { background:repeating-linear-gradient(45deg,#f3f4f7,#f3f4f7 4px,#eceef2 4px,#eceef2 8px); color:var(--muted); }
.blk.shared { border:2px solid #6a1b9a; }
.blk.shared .rc { color:#6a1b9a; }
.blk.bad { border:2px dashed var(--bad); }
.blk.bad .rc { color:var(--bad); }
.blk .mismatch { color:var(--bad); font-weight:700; font-size:10px; white-space:nowrap; }
.blk.moved { box-shadow: inset 0 0 0 2px #ff9800; }
.blk .xfer { position:absolute; left:3px; bottom:2px; font-size:9px; font-weight:700; text-transform:uppercase;
  padding:0 3px; border-radius:3px; color:#fff; }
.xfer.load, .xfer-sample.load { background:#0277bd; }
.xfer.send, .xfer-sample.send { background:#00897b; }
.xfer.failed, .xfer-sample.failed { background:var(--bad); }
.xfer.held, .xfer-sample.held { background:#6d4c41; }
.xfer-sample { display:inline-block; font-size:9px; font-weight:700; text-transform:uppercase; color:#fff;
  padding:0 3px; border-radius:3px; margin-right:4px; vertical-align:middle; }
.extra-part { margin:4px 0 10px; }
.blk.sample { display:inline-block; width:18px; height:14px; vertical-align:middle; margin-right:4px; padding:0; }
.legend { display:flex; gap:16px; flex-wrap:wrap; font-size:12px; color:var(--muted); }
table { border-collapse:collapse; width:100%; font-size:12.5px; }
th, td { text-align:left; padding:3px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
th { color:var(--muted); font-weight:600; font-size:12px; }
td.mono, .mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.reasons { margin:0; padding-left:18px; }
.reasons li { margin:2px 0; }
.events div { margin:2px 0; }
.tag { display:inline-block; font-size:11px; padding:0 6px; border-radius:8px; background:#eef1f6; color:#3b4252; margin-right:4px; }
.tag.prefill { background:#dbe4ff; }
.tag.decode { background:#e3f4e4; }
.tag.preempt { background:#ffe7c2; }
.tag.finish { background:#ede7f6; }
.tag.outcome { background:#fff3bf; }
@media (max-width: 900px) { .grid { grid-template-columns: 1fr; } }
"""

_JS = r"""
"use strict";
(function () {
  var DATA = JSON.parse(document.getElementById("kvsched-data").textContent);
  var steps = DATA.steps;
  var state = { i: 0, phase: "after" };
  var PHASES = ["before", "mid", "after"];
  var PHASE_NAMES = { before: "before schedule()", mid: "after schedule()", after: "after the step" };

  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }

  // Stable colours per request: golden-angle hues in arrival order.
  var colour = {};
  DATA.requests.forEach(function (r, k) {
    colour[r.id] = "hsl(" + Math.round((k * 137.508 + 200) % 360) + ", 70%, 82%)";
  });
  function colourOf(rid) { return colour[rid] || "#e0e0e0"; }
  var requestById = {};
  DATA.requests.forEach(function (r) { requestById[r.id] = r; });
  function chip(rid, extra, cls) {
    var c = el("span", "chip" + (cls ? " " + cls : ""), rid);
    var r = requestById[rid];
    if (r) {
      c.title = rid + ": prompt " + r.prompt_len + " tokens, max_tokens " + r.max_tokens + ", n " + r.n +
        ", priority " + r.priority + ", arrives at step " + r.arrival_step;
    }
    c.style.background = colourOf(rid);
    if (extra) { c.appendChild(el("small", null, extra)); }
    return c;
  }

  var byStep = {};
  var endViolations = [];
  DATA.violations.forEach(function (v) {
    if (v.step === null || v.step === undefined) { endViolations.push(v); return; }
    (byStep[v.step] = byStep[v.step] || []).push(v);
  });
  function indexOfStep(stepNo) {
    for (var k = 0; k < steps.length; k++) { if (steps[k].step === stepNo) { return k; } }
    return -1;
  }
  function violationsAt(i) {
    var list = (byStep[steps[i].step] || []).slice();
    if (i === steps.length - 1) { list = list.concat(endViolations); }
    return list;
  }
  var violatingIdx = [];
  for (var k = 0; k < steps.length; k++) { if (violationsAt(k).length) { violatingIdx.push(k); } }

  // ---------------------------------------------------------------- header
  $("title").textContent = "kvsched trace · " + DATA.title;
  var cfg = DATA.config;
  $("config").textContent = Object.keys(cfg).map(function (key) { return key + "=" + cfg[key]; }).join("  ") +
    "  (watermark " + DATA.watermark_blocks + " blocks)  ·  " + DATA.requests.length + " request(s), " +
    steps.length + " step(s)";
  var verdict = $("verdict");
  if (DATA.violations.length) {
    var ids = [];
    DATA.violations.forEach(function (v) { if (ids.indexOf(v.id) < 0) { ids.push(v.id); } });
    verdict.className = "bad";
    verdict.textContent = DATA.violations.length + " violation(s): " + ids.join(", ");
  } else {
    verdict.className = "ok";
    verdict.textContent = "all checked invariants hold";
  }
  $("btn-violation").disabled = violatingIdx.length === 0;

  // ---------------------------------------------------------------- timeline
  var timeline = $("timeline");
  var ticks = steps.map(function (s, i) {
    var t = el("span", "tick", s.step);
    var out = s.output;
    if (out.scheduled.some(function (x) { return x.prefill; })) { t.classList.add("has-prefill"); }
    if (out.preempted.length) { t.classList.add("has-preempt"); }
    if (violationsAt(i).length) { t.classList.add("violating"); t.title = "violation at step " + s.step; }
    t.addEventListener("click", function () { go(i); });
    timeline.appendChild(t);
    return t;
  });

  // The parts beyond queues and pools that some snapshot of the run observed (each shown only then).
  var observed = { transfers: false, fenced: false, groups: false, encoder: false, pause: false };
  steps.forEach(function (s) {
    PHASES.forEach(function (p) {
      var snap = s[p];
      if (!snap) { return; }
      if (snap.transfers || snap.reported) { observed.transfers = true; }
      if ((snap.fenced && snap.fenced.length) || (snap.cache_holds && snap.cache_holds.length)) { observed.fenced = true; }
      if (snap.group_tables) { observed.groups = true; }
      // an engine without an encoder cache reports it empty, and one never paused reports "unpaused"
      if (snap.encoder_cache && (cfg.encoder_cache_size || Object.keys(snap.encoder_cache).length)) { observed.encoder = true; }
      if (snap.pause_state && snap.pause_state !== "unpaused") { observed.pause = true; }
    });
  });
  var anyExtra = observed.transfers || observed.fenced || observed.encoder || observed.pause;
  function blocksText(list) { return "[" + list.map(function (b) { return b === DATA.null_block ? "\u00b7" : b; }).join(", ") + "]"; }

  // ---------------------------------------------------------------- per-step rendering
  function snapshotOf(s, phase) {
    var snap = s[phase];
    if (snap) { return { snap: snap, phase: phase }; }
    return { snap: s.after, phase: "after" };
  }

  function renderViolations(i) {
    var panel = $("violation-panel");
    clear(panel);
    var list = violationsAt(i);
    panel.hidden = list.length === 0;
    if (!list.length) { return; }
    panel.appendChild(el("h2", null, "Invariant violated at step " + steps[i].step));
    var groups = [];
    var byId = {};
    list.forEach(function (v) {
      var key = v.id + "|" + (v.step === null || v.step === undefined ? "end" : "step");
      if (!byId[key]) { byId[key] = { v: v, messages: [] }; groups.push(byId[key]); }
      byId[key].messages.push(v.message);
    });
    groups.forEach(function (g) {
      var v = g.v;
      var d = el("div", "violation");
      d.dataset.invariant = v.id;
      var head = el("div");
      head.appendChild(el("span", "vid", v.id + " "));
      if (v.category) { head.appendChild(el("span", "tag", v.category)); }
      if (v.step === null || v.step === undefined) { head.appendChild(el("span", "tag", "end of run")); }
      head.appendChild(el("span", "statement", v.statement || "(invariant not in this catalogue)"));
      d.appendChild(head);
      var ul = el("ul", "message");
      g.messages.forEach(function (msg) { ul.appendChild(el("li", null, msg)); });
      d.appendChild(ul);
      panel.appendChild(d);
    });
  }

  function renderLanes(snap, s) {
    var lanes = $("lanes");
    clear(lanes);
    var added = {};
    s.added.forEach(function (r) { added[r] = true; });
    function lane(name, ids, fn) {
      var row = el("div", "lane");
      row.dataset.lane = name;
      row.appendChild(el("div", "lane-name", name));
      var items = el("div", "lane-items");
      if (ids === null || ids === undefined) {
        items.appendChild(el("span", "empty", "not observed"));
      } else if (!ids.length) {
        items.appendChild(el("span", "empty", "empty"));
      } else {
        ids.forEach(function (rid) { items.appendChild(fn(rid)); });
      }
      row.appendChild(items);
      lanes.appendChild(row);
    }
    function seqsOf(rid) {
      if (!snap || !snap.seqs) { return []; }
      return Object.keys(snap.seqs).filter(function (k) { return snap.seqs[k].request === rid; });
    }
    function info(rid) {
      var n = seqsOf(rid).filter(function (k) { return snap.seqs[k].status.indexOf("FINISHED") !== 0; }).length;
      return n > 1 ? "\u00d7" + n : "";
    }
    ["waiting", "running", "swapped"].forEach(function (q) {
      lane(q, snap ? snap[q] : null, function (rid) { return chip(rid, info(rid), added[rid] ? "new" : ""); });
    });
    var finished = [];
    if (snap && snap.statuses) {
      Object.keys(snap.statuses).forEach(function (rid) {
        if (snap.statuses[rid].indexOf("FINISHED_") === 0) { finished.push(rid); }
      });
    } else if (snap) { finished = null; }
    lane("finished", finished, function (rid) {
      return chip(rid, snap.statuses[rid].replace("FINISHED_", "").toLowerCase(), "gone");
    });
    var pending = DATA.requests.filter(function (r) { return r.arrival_step > s.step; });
    if (pending.length) {
      lane("not yet", pending.map(function (r) { return r.id; }), function (rid) {
        var r = DATA.requests.filter(function (x) { return x.id === rid; })[0];
        return chip(rid, "@" + r.arrival_step, "gone");
      });
    }
  }

  function renderMap(node, titleNode, label, phaseText, device, total, refs, free, snap, moved) {
    clear(node);
    var owners = {};
    var entries = {};
    function hold(b, who) {  // one entry pointing at block b, on behalf of who
      (owners[b] = owners[b] || []);
      if (owners[b].indexOf(who) < 0) { owners[b].push(who); }
      entries[b] = (entries[b] || 0) + 1;
    }
    if (snap && snap.seqs) {
      Object.keys(snap.seqs).forEach(function (sid) {
        var v = snap.seqs[sid];
        if (v.device !== device || !v.blocks) { return; }
        v.blocks.forEach(function (b) { hold(b, v.request); });
      });
    }
    var marks = {};  // block -> [kind, who]: what a transfer or a hold without a table does to it
    if (snap && device === "gpu") {
      Object.keys(snap.group_tables || {}).forEach(function (sid) {  // KV cache groups 1.. count in the one pool
        var v = snap.seqs ? snap.seqs[sid] : null;
        snap.group_tables[sid].forEach(function (table) {
          table.forEach(function (b) { if (b !== DATA.null_block) { hold(b, v ? v.request : sid); } });
        });
      });
      (snap.fenced || []).forEach(function (b) { hold(b, "held"); marks[b] = ["held", "for the writes of steps in flight"]; });
      (snap.cache_holds || []).forEach(function (b) { hold(b, "cache"); marks[b] = ["held", "by the prefix cache"]; });
      Object.keys(snap.transfers || {}).forEach(function (rid) {
        var t = snap.transfers[rid];
        t.blocks.forEach(function (b) {
          marks[b] = t.failed.indexOf(b) >= 0 ? ["failed", "a load for " + rid + " that fails to fill it"] :
            [t.kind, (t.kind === "load" ? "a load for " : "a send from ") + rid + " in flight"];
        });
      });
    }
    if (!refs && !(snap && snap.seqs)) {
      titleNode.textContent = label + phaseText;
      node.appendChild(el("span", "empty", "not observed"));
      return;
    }
    var n = refs ? refs.length : total;
    var used = 0;
    for (var b = 0; b < n; b++) {
      var rc = refs ? refs[b] : (entries[b] || 0);
      var who = owners[b] || [];
      var cell = el("div", "blk");
      cell.dataset.block = b;
      cell.appendChild(el("div", "bid", "#" + b));
      if (rc > 0 || who.length) {
        used++;
        cell.appendChild(el("div", "owner", who.length ? who.join(",") : "?"));
        var mismatch = refs && rc !== (entries[b] || 0);
        cell.appendChild(el("span", "rc", "rc " + rc));
        if (mismatch) { cell.appendChild(el("div", "mismatch", "tables: " + (entries[b] || 0))); }
        if (who.length) { cell.style.background = colourOf(who[0]); }
        if (rc > 1 || (entries[b] || 0) > 1) { cell.classList.add("shared"); }
      } else {
        cell.classList.add("free");
      }
      if (refs && rc !== (entries[b] || 0)) {
        cell.classList.add("bad");
        cell.title = "reference count " + rc + ", but " + (entries[b] || 0) + " table entries point here";
      } else {
        cell.title = "block " + b + ": " + (who.length ? "held by " + who.join(", ") + ", " : "free, ") +
          "reference count " + rc;
      }
      if (moved[b]) { cell.classList.add("moved"); cell.title += " (" + moved[b] + ")"; }
      if (marks[b]) {
        cell.appendChild(el("span", "xfer " + marks[b][0], marks[b][0]));
        cell.dataset.mark = marks[b][0];
        cell.title += "; " + marks[b][1];
      }
      node.appendChild(cell);
    }
    var freeText = (free === null || free === undefined) ? "" : ", " + free + " free";
    titleNode.textContent = label + " (" + n + freeText + ")" + phaseText;
    if (!n) { node.appendChild(el("span", "empty", refs ? "no blocks" : "not observed")); }
  }

  function renderEvents(s) {
    var box = $("events");
    clear(box);
    function line(tag, cls, text) {
      var d = el("div");
      d.appendChild(el("span", "tag " + (cls || ""), tag));
      d.appendChild(document.createTextNode(text));
      box.appendChild(d);
    }
    if (s.added.length) { line("arrived", "", s.added.join(", ")); }
    if (s.aborted.length) { line("aborted", "finish", s.aborted.join(", ")); }
    var o = s.output;
    if (o.preempted.length) {
      line("preempted", "preempt", o.preempted.map(function (p) { return p.request + " (" + p.mode + ")"; }).join(", "));
    }
    if (o.swapped_in.length) { line("swapped in", "decode", o.swapped_in.join(", ")); }
    if (o.ignored.length) { line("ignored", "finish", o.ignored.join(", ")); }
    var depth = DATA.pipeline_depth || 0;
    if (depth) {
      line("outcome", "outcome", s.outcome_of === null ? "none yet (the pipeline fills: depth " + depth + ")" :
        "of step " + s.outcome_of + " processed (depth " + depth + "); in flight after it: step " + s.in_flight.join(", "));
    }
    if (s.stopped.length) {
      line("stop token", "", s.stopped.join(", ") + (depth ? " (sampled by this step; seen at step " + (s.step + depth) + ")" : ""));
    }
    s.finished.forEach(function (f) {
      var of = (depth && f.outcome_of !== null && f.outcome_of !== undefined) ? " (outcome of step " + f.outcome_of + ")" : "";
      line("finished", "finish", f.request + ": " + f.status.replace("FINISHED_", "").toLowerCase() + of);
    });
    line("tokens", "", o.scheduled.reduce(function (a, x) { return a + x.tokens; }, 0) + " of " +
      cfg.max_num_batched_tokens + " budget, " + o.scheduled.length + " seq(s) of " + cfg.max_num_seqs);
  }

  function renderScheduled(s) {
    var box = $("scheduled");
    clear(box);
    var o = s.output;
    if (!o.scheduled.length) { box.appendChild(el("span", "empty", "nothing scheduled")); return; }
    var t = el("table");
    var h = el("tr");
    ["seq", "tokens", "kind"].forEach(function (c) { h.appendChild(el("th", null, c)); });
    t.appendChild(h);
    o.scheduled.forEach(function (x) {
      var r = el("tr");
      var c = el("td");
      c.appendChild(chip(x.seq));
      c.firstChild.style.background = colourOf(x.request);
      r.appendChild(c);
      r.appendChild(el("td", "mono", x.tokens));
      var k = el("td");
      k.appendChild(el("span", "tag " + (x.prefill ? "prefill" : "decode"), x.prefill ? "prefill" : "decode"));
      r.appendChild(k);
      t.appendChild(r);
    });
    box.appendChild(t);
  }

  function renderMaps(s) {
    var box = $("maps");
    clear(box);
    var o = s.output;
    var any = false;
    [["swap out", "GPU \u2192 CPU", o.swap_out], ["swap in", "CPU \u2192 GPU", o.swap_in],
     ["copy-on-write", "GPU \u2192 GPU", o.copies]].forEach(function (m) {
      if (!m[2].length) { return; }
      any = true;
      var d = el("div");
      d.appendChild(el("span", "tag preempt", m[0]));
      d.appendChild(el("span", "mono", m[1] + ": " + m[2].map(function (p) { return p[0] + "\u2192" + p[1]; }).join("  ")));
      box.appendChild(d);
    });
    if (!any) { box.appendChild(el("span", "empty", "none")); }
  }

  function renderReasons(s) {
    var ul = $("reasons");
    clear(ul);
    s.explain.forEach(function (text) {
      var li = el("li", "", text);
      ul.appendChild(li);
    });
  }

  function renderSeqs(snap) {
    var box = $("seqs");
    clear(box);
    if (!snap || !snap.seqs) { box.appendChild(el("span", "empty", "not observed")); return; }
    var ids = Object.keys(snap.seqs);
    if (!ids.length) { box.appendChild(el("span", "empty", "no sequences yet")); return; }
    var t = el("table");
    var h = el("tr");
    var heads = ["seq", "status", "tokens", "computed", "device", "block table"];
    if (observed.groups) { heads.push("groups 1.. (\u00b7 null block)"); }
    heads.forEach(function (c) { h.appendChild(el("th", null, c)); });
    t.appendChild(h);
    ids.forEach(function (sid) {
      var v = snap.seqs[sid];
      var r = el("tr");
      var c = el("td");
      c.appendChild(chip(sid));
      c.firstChild.style.background = colourOf(v.request);
      r.appendChild(c);
      r.appendChild(el("td", "mono", v.status));
      r.appendChild(el("td", "mono", v.tokens === null ? "?" : v.tokens));
      r.appendChild(el("td", "mono", v.computed === null ? "?" : v.computed));
      r.appendChild(el("td", "mono", v.device || "-"));
      r.appendChild(el("td", "mono", v.blocks === null ? "?" : "[" + v.blocks.join(", ") + "]"));
      if (observed.groups) {
        var tables = snap.group_tables ? snap.group_tables[sid] : null;
        r.appendChild(el("td", "mono", snap.group_tables === null ? "?" : (tables || []).map(blocksText).join(" ")));
      }
      t.appendChild(r);
    });
    box.appendChild(t);
  }

  function renderExtra(snap) {
    var card = $("extra-card");
    card.hidden = !anyExtra;
    if (!anyExtra) { return; }
    var box = $("extra");
    clear(box);
    function part(title, fill) {
      var d = el("div", "extra-part");
      d.appendChild(el("h3", null, title));
      fill(d);
      box.appendChild(d);
    }
    function transferTable(d, transfers, key) {
      if (!snap || transfers === null || transfers === undefined) { d.appendChild(el("span", "empty", "not observed")); return; }
      var ids = Object.keys(transfers);
      if (!ids.length) { d.appendChild(el("span", "empty", "none")); return; }
      var t = el("table");
      t.dataset.part = key;
      var h = el("tr");
      ["request", "kind", "blocks", "KV reaches", "waits for it", "failed blocks"].forEach(function (c) { h.appendChild(el("th", null, c)); });
      t.appendChild(h);
      ids.forEach(function (rid) {
        var x = transfers[rid];
        var r = el("tr");
        var c = el("td");
        c.appendChild(chip(rid));
        r.appendChild(c);
        r.appendChild(el("td", null, x.kind));
        r.appendChild(el("td", "mono", blocksText(x.blocks)));
        r.appendChild(el("td", "mono", x.kind === "load" ? x.tokens + " tokens" : "-"));
        r.appendChild(el("td", null, x.kind === "load" ? (x.async ? "yes (waiting for remote KV)" : "no (this step)") : "-"));
        r.appendChild(el("td", "mono", x.failed.length ? blocksText(x.failed) : "-"));
        t.appendChild(r);
      });
      d.appendChild(t);
    }
    if (observed.transfers) {
      part("Connector transfers in flight", function (d) { transferTable(d, snap ? snap.transfers : null, "transfers"); });
      part("Reported done by this step's outcome", function (d) { transferTable(d, snap ? snap.reported : null, "reported"); });
    }
    if (observed.fenced) {
      part("GPU blocks held without a block table", function (d) {
        var f = snap && snap.fenced ? snap.fenced : [], c = snap && snap.cache_holds ? snap.cache_holds : [];
        d.appendChild(el("div", "mono", "for in-flight writes: " + (f.length ? blocksText(f) : "none")));
        d.appendChild(el("div", "mono", "by the prefix cache: " + (c.length ? blocksText(c) : "none")));
      });
    }
    if (observed.encoder) {
      part("Encoder cache", function (d) {
        if (!snap || !snap.encoder_cache) { d.appendChild(el("span", "empty", "not observed")); return; }
        var free = snap.encoder_free === null || snap.encoder_free === undefined ? "?" : snap.encoder_free;
        d.appendChild(el("div", "mono", free + " of " + cfg.encoder_cache_size + " embeddings free"));
        var hashes = Object.keys(snap.encoder_cache);
        if (!hashes.length) { d.appendChild(el("span", "empty", "no entries")); return; }
        var t = el("table");
        t.dataset.part = "encoder";
        var h = el("tr");
        ["content hash", "embeddings", "held by"].forEach(function (c) { h.appendChild(el("th", null, c)); });
        t.appendChild(h);
        hashes.forEach(function (k) {
          var e = snap.encoder_cache[k];
          var r = el("tr");
          r.appendChild(el("td", "mono", k));
          r.appendChild(el("td", "mono", e.size));
          var u = el("td");
          if (e.users.length) { e.users.forEach(function (rid) { u.appendChild(chip(rid)); }); }
          else { u.appendChild(el("span", "empty", "nobody (kept for reuse, freeable)")); }
          r.appendChild(u);
          t.appendChild(r);
        });
        d.appendChild(t);
      });
    }
    if (observed.pause) {
      part("Engine", function (d) {
        d.appendChild(el("div", "mono", snap && snap.pause_state ? snap.pause_state.replace("_", " ") : "not observed"));
      });
    }
  }

  function render() {
    var i = state.i;
    var s = steps[i];
    var chosen = snapshotOf(s, state.phase);
    var snap = chosen.snap;
    var label = $("step-label");
    label.textContent = "step " + s.step + "  (" + (i + 1) + " / " + steps.length + ")";
    label.dataset.step = s.step;
    var bad = violationsAt(i).length > 0;
    label.classList.toggle("violating", bad);
    var named = $("step-violation");  // the violated invariants' own lines, next to the step
    var seen = [];
    named.textContent = violationsAt(i).filter(function (v) {
      if (seen.indexOf(v.id) >= 0) { return false; } seen.push(v.id); return true;
    }).map(function (v) { return v.id + ": " + (v.statement || ""); }).join("  \u2022  ");
    named.title = named.textContent;
    named.hidden = !bad;
    document.body.dataset.step = s.step;
    document.body.classList.toggle("at-violation", bad);
    ticks.forEach(function (t, k) { t.classList.toggle("current", k === i); });
    $("btn-prev").disabled = i === 0;
    $("btn-first").disabled = i === 0;
    $("btn-next").disabled = i === steps.length - 1;
    $("btn-last").disabled = i === steps.length - 1;
    Array.prototype.forEach.call(document.querySelectorAll("[data-phase]"), function (b) {
      b.classList.toggle("on", b.dataset.phase === chosen.phase);
      b.disabled = !s[b.dataset.phase];
    });
    renderViolations(i);
    renderLanes(snap, s);
    var gpuMoved = {}, cpuMoved = {};
    var o = s.output;
    o.swap_out.forEach(function (p) { gpuMoved[p[0]] = "swapped out"; cpuMoved[p[1]] = "swapped out to here"; });
    o.swap_in.forEach(function (p) { cpuMoved[p[0]] = "swapped in"; gpuMoved[p[1]] = "swapped in to here"; });
    o.copies.forEach(function (p) { gpuMoved[p[0]] = "copy source"; gpuMoved[p[1]] = "copy destination"; });
    var phaseText = " \u2014 " + PHASE_NAMES[chosen.phase];
    renderMap($("gpu-map"), $("gpu-title"), "GPU blocks", phaseText, "gpu", cfg.num_gpu_blocks,
      snap ? snap.gpu_ref_counts : null, snap ? snap.gpu_free : null, snap, gpuMoved);
    renderMap($("cpu-map"), $("cpu-title"), "CPU (swap) blocks", phaseText, "cpu", cfg.num_cpu_blocks,
      snap ? snap.cpu_ref_counts : null, snap ? snap.cpu_free : null, snap, cpuMoved);
    renderEvents(s);
    renderScheduled(s);
    renderMaps(s);
    renderReasons(s);
    renderSeqs(snap);
    renderExtra(snap);
    if (history.replaceState && location.protocol !== "about:") {
      try { history.replaceState(null, "", "#step=" + s.step); } catch (e) { /* file:// may refuse */ }
    }
  }

  function go(i) {
    if (!steps.length) { return; }
    state.i = Math.max(0, Math.min(steps.length - 1, i));
    render();
  }
  function nextViolation() {
    if (!violatingIdx.length) { return; }
    for (var k = 0; k < violatingIdx.length; k++) { if (violatingIdx[k] > state.i) { go(violatingIdx[k]); return; } }
    go(violatingIdx[0]);
  }
  function cyclePhase() {
    var s = steps[state.i];
    var k = PHASES.indexOf(state.phase);
    for (var n = 1; n <= PHASES.length; n++) {
      var p = PHASES[(k + n) % PHASES.length];
      if (s[p]) { state.phase = p; break; }
    }
    render();
  }

  $("btn-first").addEventListener("click", function () { go(0); });
  $("btn-prev").addEventListener("click", function () { go(state.i - 1); });
  $("btn-next").addEventListener("click", function () { go(state.i + 1); });
  $("btn-last").addEventListener("click", function () { go(steps.length - 1); });
  $("btn-violation").addEventListener("click", nextViolation);
  Array.prototype.forEach.call(document.querySelectorAll("[data-phase]"), function (b) {
    b.addEventListener("click", function () { state.phase = b.dataset.phase; render(); });
  });
  document.addEventListener("keydown", function (e) {
    if (e.altKey || e.ctrlKey || e.metaKey) { return; }
    var handled = true;
    switch (e.key) {
      case "ArrowRight": case "ArrowDown": case "j": case "n": go(state.i + 1); break;
      case "ArrowLeft": case "ArrowUp": case "k": case "p": go(state.i - 1); break;
      case "Home": go(0); break;
      case "End": go(steps.length - 1); break;
      case "v": nextViolation(); break;
      case "s": cyclePhase(); break;
      default: handled = false;
    }
    if (handled) { e.preventDefault(); }
  });

  if (!steps.length) {
    $("step-label").textContent = "no steps recorded";
    return;
  }
  function fromFragment() {
    var m = /step=(\d+)/.exec(location.hash || "");
    return m ? indexOfStep(parseInt(m[1], 10)) : -1;
  }
  window.addEventListener("hashchange", function () {
    var i = fromFragment();
    if (i >= 0 && i !== state.i) { go(i); }
  });
  var start = fromFragment();  // else the first violating step: what the page is opened to see
  go(start >= 0 ? start : (violatingIdx.length ? violatingIdx[0] : 0));
})();
"""
