"""The wire protocol (version 2): adapters whose scheduler runs in another process, over JSON lines.

`WireAdapter` is the runner's side; `conformance/targets/hosts/kvsched_host.py` is a standalone
helper for writing a host in Python without kvsched installed. docs/PROTOCOL.md is the
specification, for hosts in any language.
"""

from conformance.wire.client import PROTOCOL_VERSION, HostProcess, WireAdapter, acquire_host
from conformance.wire.codec import WireError, snapshot_from_json, snapshot_to_json

__all__ = ["PROTOCOL_VERSION", "HostProcess", "WireAdapter", "WireError", "acquire_host", "snapshot_from_json",
           "snapshot_to_json"]
