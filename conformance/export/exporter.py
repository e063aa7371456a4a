"""Assemble an exported test: pick the target and the property, then join the fragments.

Checked before anything is written (`conformance.commands.export` writes the text): the target is
known and has an exporter, the trace was found on that target (``meta.adapter``), and the
property (``--property``, else the trace's ``meta.problem`` / ``meta.problems``, else its finding's)
has a check for that engine. Each refusal is one `InputError`.
"""

from __future__ import annotations

import ast
import pprint
import textwrap
from pathlib import Path

from conformance.export import lmdeploy, nano_vllm, sglang, tokasaurus, vidur, vllm_v0, vllm_v1
from conformance.export.findings import finding_of
from conformance.export.literals import trace_literals
from conformance.export.record import Exporter
from conformance.export.strangers import export_target, export_target_names
from conformance.export.unsupported import UNSUPPORTED
from spec.catalogue import get as get_invariant
from spec.errors import InputError
from spec.trace import Trace

TEMPLATES = Path(__file__).parent / "templates"
ENGINES = (vllm_v1, vllm_v0, nano_vllm, vidur, lmdeploy, sglang, tokasaurus)
EXPORTERS: dict[str, Exporter] = {e.target: e for m in ENGINES for e in m.EXPORTERS}
# An invariant whose statement needs kvsched's step bookkeeping, checked as the plain property it implies.
STANDALONE_FORM = {"RES-005": "RES-004", "SWP-003": "SWP-001", "CAP-003": "CHK-002", "SPD-005": "CHK-002",
                   "LIV-003": "LIV-001", "CHK-003": "RES-003", "STR-002": "BUD-003", "OUT-001": "REQ-004", "CHK-004": "REQ-004"}
CONNECTOR_IDIOM = ("; a scripted KV connector (KV_SCRIPTS) registered in vLLM's KVConnectorFactory and set up "
                   "through KVTransferConfig, the workers' KVConnectorOutput played in each model output")
SESSION_IDIOM = ("; streaming-input sessions as vLLM's client sends them: a resumable Request, then each later input "
                 "as another add_request of the same id, and a non-resumable one to end the session")
FAULT_STATEMENT = ("every call on the scheduler returns: a config the engine accepted and the requests it admitted "
                   "never crash it (an assert or exception here ends the engine and every request in it)")


def trace_target(trace: Trace) -> str | None:
    """The target a trace was found on (``meta.adapter``, else ``meta.adapter_spec``), if it is one."""
    for key in ("adapter", "adapter_spec"):
        name = trace.meta.get(key)
        if isinstance(name, str) and export_target(name) is not None:
            return name
    return None


def exporter_for(trace: Trace, target: str | None) -> Exporter:
    """The exporter of ``target`` (default: the trace's own), refusing a trace found on another."""
    found = trace_target(trace)
    name = target or found
    if name is None:
        raise InputError("--target", "the trace names no target (meta.adapter); pass --target NAME")
    if export_target(name) is None:
        raise InputError("--target", f"unknown target {name!r} (known: {', '.join(export_target_names())})")
    if found is not None and found != name:
        raise InputError("--target", f"the trace was found on {found}, not {name}: export it with --target {found}")
    if name in UNSUPPORTED:
        raise InputError("--target", f"{name} cannot be exported: {UNSUPPORTED[name]}")
    if name not in EXPORTERS:
        raise InputError("--target", f"{name} has no exporter (exporters: {', '.join(EXPORTERS)})")
    return EXPORTERS[name]


def _listed(value: object) -> list[str]:
    """A meta field that lists problems: a list, or its repr as the lockstep campaigns save it."""
    if isinstance(value, str) and value.startswith("["):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


def trace_property(trace: Trace, exporter: Exporter, chosen: str | None = None) -> str:
    """The property the exported test asserts: ``chosen``, else the first the trace's meta names
    that the engine has a check for, else its finding's."""
    if chosen is not None:
        if chosen not in exporter.properties:
            raise InputError("--property", f"{exporter.target} has no standalone check of {chosen!r} "
                             f"(it has: {', '.join(exporter.properties)})")
        return chosen
    named = [STANDALONE_FORM.get(p, p) for p in _listed(trace.meta.get("problem")) + _listed(trace.meta.get("problems"))]
    finding = finding_of(trace, exporter.target)
    if finding is not None:
        named.append(finding.property)
    if "adapter raised" in str(trace.meta.get("message", "")):
        named.append("FAULT-raised")
    for problem in named:
        if problem in exporter.properties:
            return problem
    shown = ", ".join(p for p in named if p != "LOCKSTEP") or (
        "only a lockstep divergence (no property)" if "LOCKSTEP" in named else "no property")
    raise InputError("--property", f"the trace names {shown}; {exporter.target} has standalone checks of "
                     f"{', '.join(exporter.properties)} only (pass --property ID)")


def statement(property_id: str) -> str:
    if property_id == "FAULT-raised":
        return FAULT_STATEMENT
    return " ".join(get_invariant(property_id).statement.split())


def render_pytest(trace: Trace, exporter: Exporter, property_id: str, source: str) -> str:
    """The exported file's text (``source``: the trace's path, for the docstring)."""
    target = export_target(exporter.target)
    finding = finding_of(trace, exporter.target)
    title = finding.title if finding else f"{property_id} on {exporter.target}"
    parts = [
        _docstring(title, target.version, exporter, property_id, source, _chosen_flag(trace, exporter, property_id),
                   (CONNECTOR_IDIOM if trace.config.kv_connector else "")
                   + (SESSION_IDIOM if has_sessions(trace) else "")),
        (TEMPLATES / f"{exporter.engine}.py.in").read_text().replace("# @TARGET@\n", exporter.preamble),
    ]
    if exporter.extra:
        parts.append((TEMPLATES / f"{exporter.extra}.py.in").read_text())
    if is_hybrid(trace):
        parts.append((TEMPLATES / f"{hybrid_fragment(exporter, trace)}.py.in").read_text())
    if trace.config.kv_connector:
        parts += [(TEMPLATES / f"{name}.py.in").read_text() for name in connector_fragments(exporter)]
    if has_sessions(trace):
        parts.append((TEMPLATES / f"{sessions_fragment(exporter, trace)}.py.in").read_text())
    parts += [
        "\n\n" + trace_literals(trace, exporter.prompt_of, exporter.request_extra) + _kv_scripts(trace),
        f"PROPERTY = {property_id!r}\nSTATEMENT = {statement(property_id)!r}\n",
        (TEMPLATES / "properties" / f"{property_id}.py.in").read_text(),
        (TEMPLATES / "replay.py.in").read_text(),
    ]
    return "".join(parts)


def connector_fragments(exporter: Exporter) -> tuple[str, ...]:
    """The fragments that play the KV connector of a ``kv_connector`` trace, or one refusal."""
    if not exporter.connector:
        with_one = ", ".join(e.target for e in EXPORTERS.values() if e.connector)
        raise InputError("--target", f"{exporter.target}'s export has no scripted KV connector (the trace sets "
                         f"kv_connector; exporters with one: {with_one})")
    return exporter.connector


def is_hybrid(trace: Trace) -> bool:
    """Several KV cache groups, or a single one with EAGLE's block drop (spec/kv_groups.py)."""
    return len(trace.config.kv_groups or ()) > 1 or bool(trace.config.drop_eagle_block)


def hybrid_fragment(exporter: Exporter, trace: Trace) -> str:
    """The fragment that builds a hybrid trace's KV cache groups, or one refusal."""
    if not exporter.hybrid:
        with_one = ", ".join(e.target for e in EXPORTERS.values() if e.hybrid)
        raise InputError("--target", f"{exporter.target}'s export builds no hybrid KV cache groups (the trace sets "
                         f"kv_groups or drop_eagle_block; exporters with them: {with_one})")
    if trace.config.kv_connector or has_sessions(trace):
        raise InputError("--target", f"{exporter.target}'s export does not combine hybrid KV cache groups with a KV "
                         "connector or streaming sessions")
    return exporter.hybrid


def has_sessions(trace: Trace) -> bool:
    return any(arrival.request.session for arrival in trace.arrivals)


def sessions_fragment(exporter: Exporter, trace: Trace) -> str:
    """The fragment that plays the client of a trace's streaming sessions, or one refusal."""
    if not exporter.sessions:
        with_one = ", ".join(e.target for e in EXPORTERS.values() if e.sessions)
        raise InputError("--target", f"{exporter.target}'s export plays no streaming-input session (the trace has "
                         f"sessions; exporters with them: {with_one})")
    if trace.config.kv_connector:
        raise InputError("--target", f"{exporter.target}'s export does not combine streaming sessions with a KV "
                         "connector (the V1 host does not either)")
    return exporter.sessions


def _kv_scripts(trace: Trace) -> str:
    """The KV connector's script per request (spec/connector.py), for a trace with a connector."""
    if not trace.config.kv_connector:
        return ""
    scripts = {rid: s.to_dict() for rid, s in trace.connector.items()}
    return f"KV_SCRIPTS = {pprint.pformat(scripts, width=110, sort_dicts=False, compact=True)}  # request id -> script\n"


def _chosen_flag(trace: Trace, exporter: Exporter, property_id: str) -> str:
    """`` --property ID`` when the trace alone would not export ``property_id`` (so the printed command does)."""
    try:
        default = trace_property(trace, exporter)
    except InputError:
        default = None
    return "" if default == property_id else f" --property {property_id}"


def _docstring(title: str, release: str, exporter: Exporter, property_id: str, source: str, flag: str = "",
               more_idiom: str = "") -> str:
    def para(text: str) -> str:
        return textwrap.fill(text, 100, break_on_hyphens=False, break_long_words=False)

    return "\n\n".join([
        '"""' + para(f"Reproducer: {title}."),
        para(f"Standalone: it imports the engine, never kvsched. Exported by `kvsched export {source} --to pytest "
             f"--target {exporter.target}{flag}` from kvsched's shrunk trace, for {release} "
             f"({exporter.needs or 'the installed release'})."),
        "    python THIS_FILE            # exit 1 and one FAILED line when the property breaks\n"
        "                                # (exit 2 and one ERROR line if the engine raises first)\n"
        "    python -m pytest THIS_FILE",
        para(f"How: {exporter.idiom}{more_idiom}; the trace's steps are replayed as kvsched's driver runs them (arrivals, "
             "aborts, schedule(), the model's outcome), the model played here."),
        para(f"Asserts {property_id}: {statement(property_id)}") + '\n"""\n\n',
    ])
