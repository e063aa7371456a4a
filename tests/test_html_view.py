"""The HTML trace view (issue #10, parts 2 and 3), checked in a real browser.

The browser tests drive headless Chromium over the Chrome DevTools Protocol on a pipe
(``--remote-debugging-pipe``: NUL-separated JSON on file descriptors 3 and 4), so they need no
websocket library and no free port. They load the page from a file, collect every console
message, uncaught exception, browser log error and network request, press keys and click
buttons with real input events, and read what the page shows.

Chromium is Debian's ``chromium`` package (``/usr/bin/chromium``; ``KVSCHED_CHROMIUM`` names
another binary). Without it the browser tests skip, except in CI (``CI`` set), where they fail.
The screenshot of a counterexample is written to ``docs/screenshots/trace-view.png`` in CI or
when ``KVSCHED_UPDATE_SCREENSHOTS=1``, else to the test's temporary folder.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from conformance.reports.html_view import render_html, view_data, write_html
from reference_impl.engine import run_trace
from reference_impl.scheduler import Scheduler
from reference_impl.sequence import Sequence, SequenceGroup
from reference_impl.workloads import BUILTIN
from spec.catalogue import Violation, check_records
from spec.config import SchedulerConfig
from spec.observation import ALL_CAPABILITIES
from spec.trace import Arrival, Trace
from spec.types import Request

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "docs" / "screenshots" / "trace-view.png"


# ---------------------------------------------------------------------------- a counterexample
class ForkWithoutReferences(Scheduler):
    """A mutant of the reference: forked sequences share their parent's blocks but the
    reference counts are not raised (BLK-003 fails at the fork)."""

    def _fork(self, group: SequenceGroup, parent: Sequence) -> list[Sequence]:
        children = super()._fork(group, parent)
        for child in children:
            for block in self.block_manager.gpu_tables[child.seq_id]:
                self.block_manager.gpu.ref_counts[block] -= 1
        return children


def mutant_trace() -> Trace:
    config = SchedulerConfig(
        block_size=4, num_gpu_blocks=16, num_cpu_blocks=8, max_num_seqs=4,
        max_num_batched_tokens=32, max_model_len=32, watermark=0.0,
    )
    return Trace(
        config,
        (Arrival(0, Request("B", prompt_len=6, max_tokens=6)), Arrival(2, Request("A", prompt_len=10, max_tokens=4, n=2))),
        max_steps=50,
        meta={"name": "fork-without-references"},
    )


def counterexample() -> tuple[Trace, list, list[Violation], int]:
    """The mutant's run, with the violations of its first failing step (as a runner reports)."""
    trace = mutant_trace()
    run = run_trace(trace, ForkWithoutReferences)
    found = list(check_records(trace.config, ALL_CAPABILITIES, run.records, run.drained))
    first = min(v.step for v in found if v.step is not None)
    return trace, run.records, [v for v in found if v.step == first], first


# ---------------------------------------------------------------------------- the page as text
def embedded_data(page: str) -> dict[str, Any]:
    match = re.search(r'<script id="kvsched-data" type="application/json">(.*?)</script>', page, re.S)
    assert match, "no embedded data"
    return json.loads(match.group(1))


def test_the_page_is_self_contained_and_deterministic() -> None:
    trace, records, violations, first = counterexample()
    page = render_html(trace, records, violations)
    assert page == render_html(trace, records, violations)
    assert page.startswith("<!DOCTYPE html>")
    lowered = page.lower()
    for external in ("http://", "https://", "//cdn", "<link", "@import", "url(", " src=", "@font-face"):
        assert external not in lowered, external
    assert "default-src 'none'" in page  # the browser itself refuses anything external
    data = embedded_data(page)
    assert data == json.loads(json.dumps(view_data(trace, records, violations)))
    assert [s["step"] for s in data["steps"]] == [r.step for r in records]
    (flagged,) = {v["step"] for v in data["violations"]}
    assert flagged == first
    assert data["violations"][0]["id"] == "BLK-003"
    assert data["violations"][0]["statement"].startswith("GPU reference counts equal")


def test_hostile_request_ids_cannot_break_out_of_the_data() -> None:
    config = SchedulerConfig(block_size=4, num_gpu_blocks=8, num_cpu_blocks=4, max_num_seqs=2,
                             max_num_batched_tokens=16, max_model_len=16)
    rid = "</script><script>alert(1)</script><!--&"  # a U+2028 (a JS line break) is no request id: it is not printable
    trace = Trace(config, (Arrival(0, Request(rid, prompt_len=3, max_tokens=2)),), meta={"name": "<b>x</b>\u2028"})
    run = run_trace(trace)
    page = render_html(trace, run.records, [])
    assert page.count("</script>") == 2  # the data block's and the script's own
    assert "<title>kvsched · &lt;b&gt;x&lt;/b&gt;\u2028</title>" in page
    assert embedded_data(page)["title"] == "<b>x</b>\u2028"
    assert embedded_data(page)["requests"][0]["id"] == rid


def test_write_html_creates_the_folder(tmp_path: Path) -> None:
    trace = BUILTIN["tour"]()
    run = run_trace(trace)
    path = write_html(tmp_path / "deep" / "tour.html", trace, run.records, [], title="the tour")
    assert path.read_text(encoding="utf-8") == render_html(trace, run.records, [], title="the tour")


# ---------------------------------------------------------------------------- the browser
def chromium_binary() -> str:
    chosen = os.environ.get("KVSCHED_CHROMIUM")
    for candidate in [chosen] if chosen else ["chromium", "/usr/bin/chromium", "chromium-browser"]:
        if found := shutil.which(candidate):
            return found
    reason = f"headless Chromium not found ({'KVSCHED_CHROMIUM=' + chosen if chosen else 'no chromium on PATH'}; " \
        "install Debian's package: apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(reason + "; CI must run the browser tests")
    pytest.skip(reason)


def test_missing_chromium_skips_locally_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSCHED_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="KVSCHED_CHROMIUM=/nonexistent/chromium"):
        chromium_binary()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the browser tests"):
        chromium_binary()


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe, one page attached."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000) -> None:
        self.profile = tempfile.mkdtemp(prefix="kvsched-chromium-")
        self.log_path = Path(self.profile) / "chromium-stderr.log"
        self._log = self.log_path.open("wb")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def wire_pipes() -> None:  # in the child: the protocol reads fd 3 and writes fd 4
            a = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        flags = [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
            "--remote-debugging-pipe", f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            [binary, *flags], preexec_fn=wire_pipes, close_fds=False,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        try:
            targets = self.call("Target.getTargets")["targetInfos"]
        except (OSError, EOFError, TimeoutError) as err:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            self.close()
            raise RuntimeError(f"Chromium did not start ({err}); its stderr ends:\n{tail}") from None
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    # -- protocol -----------------------------------------------------------------------
    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_chrome], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: bool = False, timeout: float = 20.0, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 20.0) -> dict[str, Any]:
        for i, event in enumerate(self.events):
            if event["method"] == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            message = self._read(deadline)
            if message.get("method") == method:
                return message
            if "method" in message:
                self.events.append(message)

    # -- page ---------------------------------------------------------------------------
    def open(self, url: str) -> None:
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        result = self.call("Page.navigate", session=True, url=url)
        if "errorText" in result:
            raise AssertionError(f"cannot open {url}: {result['errorText']}")
        if result.get("loaderId"):  # a new document (a change of fragment only loads nothing)
            self.wait_for("Page.loadEventFired")

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def poll(self, expression: str, expected: Any, timeout: float = 10.0) -> Any:
        """Evaluate until the value is ``expected`` (for what the page does asynchronously)."""
        deadline = time.monotonic() + timeout
        while (value := self.js(expression)) != expected and time.monotonic() < deadline:
            time.sleep(0.02)
        return value

    def press(self, key: str, code: str, key_code: int) -> None:
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", session=True, type=kind, key=key, code=code,
                      windowsVirtualKeyCode=key_code, nativeVirtualKeyCode=key_code,
                      text=key if (kind == "keyDown" and len(key) == 1) else "")

    def click(self, selector: str) -> None:
        box = self.js(
            f"(function(){{var r=document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
            "return [r.left + r.width / 2, r.top + r.height / 2];})()"
        )
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, path: Path) -> bytes:
        metrics = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": metrics["width"], "height": min(metrics["height"], 4000), "scale": 1}
        data = self.call("Page.captureScreenshot", session=True, format="png", clip=clip,
                         captureBeyondViewport=True)["data"]
        png = base64.b64decode(data)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        return png

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and the browser's own errors so far."""
        found = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                found.append(f"console.{p['type']}: {[a.get('value', a.get('description')) for a in p.get('args', [])]}")
            elif e["method"] == "Runtime.exceptionThrown":
                found.append(f"exception: {p['exceptionDetails'].get('exception', {}).get('description')}")
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                found.append(f"log {p['entry']['level']}: {p['entry'].get('text')}")
        return found

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (OSError, TimeoutError, EOFError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    chrome = Browser(chromium_binary())
    try:
        yield chrome
    finally:
        chrome.close()


def _label(browser: Browser) -> str:
    return browser.js("document.getElementById('step-label').dataset.step")


def test_stepping_through_a_counterexample_in_chromium(browser: Browser, tmp_path: Path) -> None:
    trace, records, violations, first = counterexample()
    page = write_html(tmp_path / "counterexample.html", trace, records, violations)
    browser.events.clear()
    browser.open(page.as_uri())

    # it opens at the first violating step, the invariant's own line beside the step number
    assert _label(browser) == str(first)
    beside = browser.js("(function(){var s=document.getElementById('step-violation');"
                        "return {hidden: s.hidden, text: s.textContent};})()")
    assert not beside["hidden"] and beside["text"].startswith("BLK-003: GPU reference counts equal")
    browser.press("Home", "Home", 36)
    assert _label(browser) == "0"
    assert browser.js("document.getElementById('step-violation').hidden") is True
    assert browser.js("document.getElementById('violation-panel').hidden") is True
    browser.press("ArrowRight", "ArrowRight", 39)  # the keyboard steps forward
    assert _label(browser) == "1"
    browser.click("#btn-next")  # and so does the button, clicked with the mouse
    assert _label(browser) == "2"
    browser.click("#btn-prev")
    assert _label(browser) == "1"
    browser.press("End", "End", 35)
    assert _label(browser) == str(records[-1].step)
    browser.press("Home", "Home", 36)
    assert _label(browser) == "0"
    # the lanes follow the step: B waits at step 0 before schedule(), runs after it
    assert browser.js("[...document.querySelectorAll('[data-lane=running] .chip')].map(c=>c.firstChild.data)") == ["B"]

    browser.press("v", "KeyV", 86)  # jump to the violation
    assert _label(browser) == str(first)
    state = browser.js("""(function(){
      var panel = document.getElementById('violation-panel');
      var tick = document.querySelector('.tick.current');
      return {
        hidden: panel.hidden, visible: panel.getBoundingClientRect().height > 0,
        text: panel.innerText, labelBad: document.getElementById('step-label').classList.contains('violating'),
        tickBad: tick.classList.contains('violating'), tickText: tick.textContent,
        badTicks: [...document.querySelectorAll('.tick.violating')].map(t => t.textContent),
        badBlocks: [...document.querySelectorAll('#gpu-map .blk.bad')].map(b => b.dataset.block),
        sharedBlocks: [...document.querySelectorAll('#gpu-map .blk.shared')].length,
        verdict: document.getElementById('verdict').textContent,
        reasons: document.getElementById('reasons').innerText,
      };
    })()""")
    assert not state["hidden"] and state["visible"]
    assert "BLK-003" in state["text"] and "GPU reference counts equal" in state["text"]
    assert "has ref count 1 but 2 table entries" in state["text"]
    assert state["labelBad"] and state["tickBad"] and state["tickText"] == str(first)
    assert state["badTicks"] == [str(first)]
    assert state["badBlocks"] == ["2", "3", "4"]  # the forked blocks, flagged on the map
    assert state["verdict"].startswith(f"{len(violations)} violation(s): BLK-003")
    assert "A admitted: prefill of 10 tokens into 3 new blocks" in state["reasons"]

    browser.click("[data-phase=before]")  # the state before schedule(): A still waits
    assert browser.js("document.getElementById('gpu-title').textContent").endswith("before schedule()")
    assert browser.js("[...document.querySelectorAll('[data-lane=waiting] .chip')].map(c=>c.firstChild.data)") == ["A"]
    browser.click("[data-phase=after]")

    out = SCREENSHOT if (os.environ.get("CI") or os.environ.get("KVSCHED_UPDATE_SCREENSHOTS")) else tmp_path / "trace-view.png"
    png = browser.screenshot(out)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 1000 and height >= 600

    assert browser.problems() == []
    assert all(url.startswith("file://") for url in browser.requests()), browser.requests()


def test_a_clean_run_and_the_step_fragment_in_chromium(browser: Browser, tmp_path: Path) -> None:
    trace = BUILTIN["tour"]()
    run = run_trace(trace)
    violations = list(check_records(trace.config, ALL_CAPABILITIES, run.records, run.drained))
    assert violations == []
    page = write_html(tmp_path / "tour.html", trace, run.records, violations)
    browser.events.clear()
    browser.open(page.as_uri() + "#step=8")  # the fragment opens the page at that step
    assert _label(browser) == "8"
    state = browser.js("""({
      verdict: document.getElementById('verdict').textContent,
      panelHidden: document.getElementById('violation-panel').hidden,
      jumpDisabled: document.getElementById('btn-violation').disabled,
      swapped: [...document.querySelectorAll('[data-lane=swapped] .chip')].map(c => c.firstChild.data),
      moved: document.querySelectorAll('#cpu-map .blk.moved').length,
      reasons: document.getElementById('reasons').innerText,
    })""")
    assert state["verdict"] == "all checked invariants hold"
    assert state["panelHidden"] and state["jumpDisabled"]
    assert state["swapped"] == ["D"] and state["moved"] == 2
    assert "D preempted by swap" in state["reasons"]
    browser.open(page.as_uri() + "#step=3")  # a new fragment on the open page moves it too (on hashchange)
    assert browser.poll("document.getElementById('step-label').dataset.step", "3") == "3"
    browser.press("s", "KeyS", 83)  # the snapshot phase cycles: after -> before
    assert browser.js("document.querySelector('[data-phase].on').dataset.phase") == "before"
    assert browser.problems() == []


def test_the_harness_sees_page_errors(browser: Browser, tmp_path: Path) -> None:
    """The no-console-errors check can fail: a broken page is caught."""
    trace = BUILTIN["seed-003-4"]()
    run = run_trace(trace)
    page = render_html(trace, run.records, []).replace('"use strict";', '"use strict"; console.error("boom");', 1)
    broken = tmp_path / "broken.html"
    broken.write_text(page.replace("function go(i) {", "function go(i) { undefinedFunction();", 1))
    browser.events.clear()
    browser.open(broken.as_uri())
    found = browser.problems()
    assert any("boom" in p for p in found), found
    assert any(p.startswith("exception:") and "undefinedFunction" in p for p in found), found
    browser.events.clear()
    external = tmp_path / "external.html"
    external.write_text(page.replace("</body>", '<img src="http://192.0.2.1/x.png"></body>'))
    browser.open(external.as_uri())  # the page's own policy blocks it, and says so
    assert any("Content Security Policy" in p for p in browser.problems()), browser.problems()


def test_a_run_with_nothing_observed_still_renders(browser: Browser, tmp_path: Path) -> None:
    """An adapter may expose only its outputs: the page says "not observed" and shows the rest."""
    trace = BUILTIN["tour"]()
    run = run_trace(trace, observe=False)
    page = write_html(tmp_path / "blind.html", trace, run.records, [])
    browser.events.clear()
    browser.open(page.as_uri())
    browser.press("ArrowRight", "ArrowRight", 39)
    assert _label(browser) == "1"
    state = browser.js("""({
      lanes: [...document.querySelectorAll('[data-lane] .empty')].map(e => e.textContent),
      gpu: document.getElementById('gpu-map').innerText,
      blocks: document.querySelectorAll('.blk[data-block]').length,
      reasons: document.getElementById('reasons').innerText,
    })""")
    assert state["lanes"][:4] == ["not observed"] * 4
    assert state["gpu"] == "not observed" and state["blocks"] == 0
    assert "C ignored" in state["reasons"]
    assert browser.problems() == []


# ---------------------------------------------------------------------------- pipelined steps
def _pipelined_run():
    """A run of the async reference at depth 1 in which a stop sampled at one step is reported
    at the next (docs/ASYNC.md)."""
    import dataclasses

    from reference_impl.async_scheduler import AsyncV1Scheduler

    config = SchedulerConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=16, max_model_len=32, watermark=0.0,
                             preemption_mode="recompute", pipeline_depth=1)
    trace = Trace(config, (Arrival(0, Request("A", prompt_len=5, max_tokens=8)),
                           Arrival(1, Request("B", prompt_len=3, max_tokens=2))), stops=((2, "A#0"),), max_steps=20)
    trace = dataclasses.replace(trace, meta={"name": "pipelined"})
    return trace, run_trace(trace, AsyncV1Scheduler)


def test_the_view_says_which_outcome_belongs_to_which_step() -> None:
    trace, run = _pipelined_run()
    data = view_data(trace, run.records, [])
    assert data["version"] == 3 and data["pipeline_depth"] == 1
    steps = data["steps"]
    assert steps[0]["outcome_of"] is None and steps[0]["in_flight"] == [0]  # the pipeline fills
    assert [s["outcome_of"] for s in steps[1:4]] == [0, 1, 2]
    stopped = next(f for s in steps for f in s["finished"] if f["request"] == "A")
    assert stopped["status"] == "FINISHED_STOPPED" and stopped["outcome_of"] == 2  # sampled at 2, reported at 3
    assert Trace.from_dict(trace.to_dict()).to_dict()["pipeline"] == {"version": 1, "depth": 1}
    synchronous = view_data(BUILTIN["tour"](), run_trace(BUILTIN["tour"]()).records, [])
    assert synchronous["pipeline_depth"] == 0 and synchronous["steps"][3]["outcome_of"] == 3


def test_a_pipelined_trace_restates_its_depth_or_is_refused() -> None:
    from spec.errors import InputError

    trace, _ = _pipelined_run()
    data = trace.to_dict()
    data["pipeline"]["depth"] = 2
    with pytest.raises(InputError, match="pipeline.depth"):
        Trace.from_dict(data)
    assert "pipeline" not in BUILTIN["tour"]().to_dict()  # synchronous traces are unchanged


def test_pipelined_outcomes_in_chromium(browser: Browser, tmp_path: Path) -> None:
    trace, run = _pipelined_run()
    page = write_html(tmp_path / "pipelined.html", trace, run.records, [])
    browser.events.clear()
    browser.open(page.as_uri() + "#step=3")
    assert _label(browser) == "3"
    events = browser.js("document.getElementById('events').innerText")
    assert "of step 2 processed (depth 1)" in events and "A: stopped (outcome of step 2)" in events, events
    browser.open(page.as_uri() + "#step=2")
    assert browser.poll("document.getElementById('step-label').dataset.step", "2") == "2"
    events = browser.js("document.getElementById('events').innerText")
    assert "sampled by this step; seen at step 3" in events, events
    assert browser.problems() == []


# ---------------------------------------------------------------------------- loads, sends, groups
def _connector_run():
    """The connector reference: A loads 16 external tokens asynchronously over two steps, one of its
    blocks failing (recomputed); B's finished blocks are held by a send for two steps."""
    from reference_impl.kv_connector_scheduler import ConnectorScheduler

    config = {"kv_connector": True, "block_size": 4, "num_gpu_blocks": 16, "max_num_seqs": 4,
              "max_num_batched_tokens": 32, "max_model_len": 64, "watermark": 0.0, "enable_chunked_prefill": True}
    trace = Trace.from_dict({
        "version": 1, "config": config, "meta": {"name": "connector-view"},
        "requests": [{"id": "A", "prompt_len": 20, "max_tokens": 3},
                     {"id": "B", "prompt_len": 10, "max_tokens": 2, "arrival_step": 1}],
        "connector": {"version": 1, "requests": [
            {"request": "A", "external_tokens": 16, "load_async": True, "load_steps": 2, "failed_blocks": [3]},
            {"request": "B", "send_steps": 2}]},
    })
    run = run_trace(trace, ConnectorScheduler)
    assert run.drained
    return trace, run


def test_the_view_data_carries_transfers_and_holds() -> None:
    trace, run = _connector_run()
    data = view_data(trace, run.records, [])
    loading = data["steps"][0]["after"]["transfers"]["A"]
    assert loading["kind"] == "load" and loading["async"] and loading["tokens"] == 16 and len(loading["failed"]) == 1
    sends = [s["step"] for s in data["steps"] if "B" in (s["after"]["transfers"] or {})
             and s["after"]["transfers"]["B"]["kind"] == "send"]
    assert sends, "B's send was never in flight"
    reported = [s["step"] for s in data["steps"] if "A" in (s["after"]["reported"] or {})]
    assert reported == [1]
    plain = view_data(mutant_trace(), counterexample()[1], [])["steps"][0]["after"]
    assert plain["transfers"] is None and plain["group_tables"] is None and plain["encoder_cache"] is None


def _marks(browser: Browser) -> list[str]:
    """The marks the GPU block map shows, one per marked block."""
    return browser.js("Array.prototype.map.call(document.querySelectorAll('#gpu-map [data-mark]'),"
                      "function (c) { return c.dataset.mark; })")


def test_loads_and_sends_in_chromium(browser: Browser, tmp_path: Path) -> None:
    trace, run = _connector_run()
    page = write_html(tmp_path / "connector.html", trace, run.records, [])
    browser.events.clear()
    browser.open(page.as_uri() + "#step=0")
    assert _label(browser) == "0"
    assert browser.js("document.getElementById('extra-card').hidden") is False
    marks = _marks(browser)
    assert sorted(marks) == ["failed", "load", "load", "load"], marks
    rows = browser.js("document.querySelector('#extra [data-part=transfers]').innerText")
    assert "load" in rows and "16 tokens" in rows and "yes (waiting for remote KV)" in rows, rows
    assert browser.js("document.querySelectorAll('#gpu-map .blk.bad').length") == 0  # holds are no mismatch
    send_step = next(r.step for r in run.records if any(t.kind == "send" for t in (r.after.kv_transfers or {}).values()))
    browser.open(page.as_uri() + f"#step={send_step}")
    assert browser.poll("document.getElementById('step-label').dataset.step", str(send_step)) == str(send_step)
    marks = _marks(browser)
    assert marks and set(marks) == {"send"}, marks
    assert browser.js("document.querySelectorAll('#gpu-map .blk.bad').length") == 0
    assert browser.problems() == []


def test_group_tables_in_chromium(browser: Browser, tmp_path: Path) -> None:
    """A sliding-window group's tables sit beside group 0's; their blocks count in the one pool."""
    from reference_impl.hybrid_scheduler import HybridV1Scheduler

    trace = Trace.from_dict({
        "version": 1, "meta": {"name": "groups-view"},
        "config": {"block_size": 4, "num_gpu_blocks": 32, "max_num_seqs": 4, "max_num_batched_tokens": 64,
                   "max_model_len": 64, "watermark": 0.0, "enable_chunked_prefill": True,
                   "kv_groups": [{"kind": "full"}, {"kind": "sliding_window", "window": 7}]},
        "requests": [{"id": "A", "prompt_len": 20, "max_tokens": 6}],
    })
    run = run_trace(trace, HybridV1Scheduler)
    page = write_html(tmp_path / "groups.html", trace, run.records, [])
    browser.events.clear()
    browser.open(page.as_uri() + "#step=3")
    assert _label(browser) == "3"
    seqs = browser.js("document.getElementById('seqs').innerText")
    assert "groups 1.." in seqs and "\u00b7" in seqs, seqs  # the window's dropped blocks are null
    assert browser.js("document.querySelectorAll('#gpu-map .blk.bad').length") == 0
    assert browser.js("document.getElementById('extra-card').hidden") is True  # nothing else to show
    assert browser.problems() == []


def test_the_encoder_cache_in_chromium(browser: Browser, tmp_path: Path) -> None:
    """Two requests share one image's encoder output: one entry, held by both while they need it."""
    from reference_impl.v1_scheduler import V1Scheduler
    from spec.encoder import EncoderInput

    config = SchedulerConfig(block_size=4, num_gpu_blocks=40, num_cpu_blocks=0, max_num_seqs=4,
                             max_num_batched_tokens=16, max_model_len=64, watermark=0.0, preemption_mode="recompute",
                             enable_chunked_prefill=True, encoder_compute_budget=6, encoder_cache_size=12)
    image = EncoderInput(4, 6, "cat")
    trace = Trace(config, (Arrival(0, Request("a", 20, 2, encoder_inputs=(image,))),
                           Arrival(0, Request("b", 20, 2, encoder_inputs=(image,)))), max_steps=40,
                  meta={"name": "encoder-view"})
    run = run_trace(trace, V1Scheduler)
    page = write_html(tmp_path / "encoder.html", trace, run.records, [])
    browser.events.clear()
    browser.open(page.as_uri() + "#step=1")
    assert _label(browser) == "1"
    part = browser.js("document.querySelector('#extra [data-part=encoder]').innerText")
    assert "cat" in part and "6" in part and "a" in part, part
    assert "6 of 12 embeddings free" in browser.js("document.getElementById('extra').innerText")
    assert browser.problems() == []
