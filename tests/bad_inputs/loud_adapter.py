"""A correct adapter that prints while it loads: `kvsched conform` holds that output in memory
until the adapter has loaded and ``--out`` exists, then writes it to the adapter's log."""

from __future__ import annotations

from conformance.runner.adapter import BUILTIN


def make():
    print("LOUD: loading the adapter", flush=True)
    return BUILTIN["reference"]()
