"""Findings leave the tool: a shrunk trace as one standalone test in the engine's own idiom.

`export_pytest(trace, target)` writes the text of a Python file that does not import kvsched. It
builds the engine's real scheduler the way the engine's own tests do, replays the trace's steps
(kvsched's driver loop: arrivals, aborts, ``schedule()``, the outcome) with the model played in
the file, and asserts one property in plain words at the step it breaks. It runs under pytest
(``test_reproducer``) and as a plain script (``python FILE``: exit 1 on failure), so a target's
venv needs no pytest.

The file is assembled from fragments in ``templates/`` (valid Python only once joined, so they
are ``.py.in``):

1. a docstring saying what the file reproduces and how to run it;
2. the trace as plain literals (`conformance.export.literals`);
3. the engine fragment (``templates/<engine>.py.in``, plus the target's extra lines);
4. the property fragment (``templates/properties/<ID>.py.in``): hooks after ``schedule()``,
   after the outcome and at the end, reading the engine through a few methods each engine
   fragment defines (``queued``, ``lengths``, ...);
5. the replay loop and the entry points (``templates/replay.py.in``).

One module per engine (`vllm_v1`, `vllm_v0`, `nano_vllm`, `vidur`) declares its targets as
`Exporter` records; `unsupported` says in one line why a target has none.
"""

from __future__ import annotations

from conformance.export.exporter import Exporter, exporter_for, render_pytest, trace_property
from conformance.export.report import render_report

__all__ = ["Exporter", "exporter_for", "render_pytest", "render_report", "trace_property"]
