"""Mutant descriptors for vLLM's V1 scheduler: which seeded bug, where, never the mutated source.

A descriptor names one mutation of one file of the *installed* vLLM package: the file (relative
to site-packages), Cosmic Ray's operator and occurrence (`cosmic_tool.py` numbers them as
``cosmic-ray init`` does), the span, the enclosing function and whether the mutated line is in
kvsched's scope. The descriptor file also pins each file's sha256, so a descriptor set made for
one vLLM build refuses to apply to another. Applying a descriptor (`materialize`) writes the
mutated file into a scratch overlay directory; the installed package is never touched, and no
vLLM source is ever committed: only these descriptors are.

The sample is drawn site first (a site is one span of source): every site is equally likely,
whatever the number of operators that apply there, so a comparison with six replacement
operators weighs no more than a ``break``. Each file keeps at least a few sites (the async
scheduler has only a handful).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

from spec.errors import InputError

VERSION = 1
PACKAGE = "vllm==0.33.0"
FILES = (
    "vllm/v1/core/sched/scheduler.py",
    "vllm/v1/core/sched/async_scheduler.py",
    "vllm/v1/core/kv_cache_manager.py",
    "vllm/v1/core/block_pool.py",
)
# Cosmic Ray operators kept: the classic sufficient set (relational, arithmetic, logical
# connector, negation, constants) plus loop and control-flow mutations. Left out: bitwise and
# power replacements (no bit arithmetic in these files worth the noise), VariableReplacer and
# VariableInserter (they need arguments and mostly make type errors), RemoveDecorator and
# ExceptionReplacer (decorators here are @property/@override; the handlers are for connectors).
_CMP = ("Eq", "NotEq", "Lt", "LtE", "Gt", "GtE", "Is", "IsNot")
_ARITH = ("Add", "Sub", "Mul", "FloorDiv", "Mod")
OPERATORS = (
    *(f"core/ReplaceComparisonOperator_{a}_{b}" for a in _CMP for b in _CMP
      if a != b and not ({a, b} & {"Is", "IsNot"} and {a, b} - {"Is", "IsNot", "Eq", "NotEq"})),
    *(f"core/ReplaceBinaryOperator_{a}_{b}" for a in _ARITH for b in _ARITH if a != b),
    "core/ReplaceUnaryOperator_USub_UAdd", "core/ReplaceUnaryOperator_Delete_Not",
    "core/AddNot", "core/ReplaceTrueWithFalse", "core/ReplaceFalseWithTrue",
    "core/ReplaceAndWithOr", "core/ReplaceOrWithAnd",
    "core/ReplaceBreakWithContinue", "core/ReplaceContinueWithBreak",
    "core/NumberReplacer", "core/ZeroIterationForLoop",
)
MIN_SITES_PER_FILE = 4

# Features kvsched does not model (spec/config.py has no knob for them): a mutation on a line, or
# in a function, that names one is out of scope. Checked in order; the first match is the reason.
OUT_OF_SCOPE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("spec-decode", ("spec_token", "spec_decode", "draft", "speculat", "eagle", "num_spec", "lookahead",
                     "rejected", "num_accepted")),
    ("kv-connector", ("connector", "kv_transfer", "remote", "recving", "sending", "kv_load", "invalid_block",
                      "load_kv", "xfer", "async_load", "kv_consumer", "kv_producer", "failed_recv", "kv_output",
                      "offload", "unpin", "pin_")),
    ("encoder/multimodal", ("encoder", "mm_", "multimodal", "mm_hash", "cross_attn")),
    ("structured-output", ("structured_output", "grammar", "bitmask", "reasoning")),
    ("lora", ("lora",)),
    ("stats/events/logging", ("stats", "metric", "logger", "log_", "kv_event", "events", "perf", "record_",
                              "iteration_details", "cudagraph", "num_cached_tokens", "get_usage")),
    ("hybrid/mamba/sliding-window", ("mamba", "sliding", "swa", "hybrid", "hisparse", "sparse", "group_id",
                                     "prefix_replay", "replay_",
                                     # sub-block hits: only with aligned Mamba states
                                     # (vllm/v1/core/kv_cache_utils.py: partial_hash_hits_enabled)
                                     "partial_block", "partial_hash")),
    ("pooling/logprobs/streaming", ("pooling", "pooler", "logprobs", "streaming", "stream_", "resumable",
                                    "routed_expert", "repetition", "session")),
    ("parallelism", ("dp_", "data_parallel", "pipeline", "pp_", "dcp", "pcp", "ec_", "kv_sharing",
                     "num_reqs_to_pad",
                     # DP prefill balancing and the V2+PP+async decode throttle (scheduler.py:389-395)
                     "prefill_capacity_bound", "current_step", "throttle")),
)


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise InputError("--venv", f"no site-packages under {venv}")
    return found[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_BLOCK_STARTS = ("if ", "if(", "elif ", "elif(", "else:", "while ", "for ", "try:", "except", "finally:", "def ",
                 "async def ", "class ", "with ", "match ", "case ")


def enclosing_headers(lines: list[str], lineno: int) -> list[str]:
    """The headers of the blocks around line ``lineno`` (1-based), innermost first, up to its
    ``def``: a mutation under ``if self.enable_kv_cache_events:`` belongs to KV events. A header
    that spans lines (``if (`` ... ``):``) is read whole; the continuation lines of a statement
    (``return (``, a closing ``):``) are not headers."""
    line = lines[lineno - 1]
    indent = len(line) - len(line.lstrip())
    out = []
    for index in range(lineno - 2, -1, -1):
        text = lines[index]
        stripped = text.strip()
        own = len(text) - len(text.lstrip())
        if not stripped or stripped.startswith("#") or own >= indent or stripped.startswith((")", "]", "}")):
            continue
        if not stripped.startswith(_BLOCK_STARTS):  # the statement a continuation line belongs to
            out.append(stripped)
            indent = own
            continue
        header = [stripped]
        for more in lines[index + 1:index + 12]:
            if header[-1].split("#")[0].rstrip().endswith(":"):
                break
            header.append(more.strip())
        if not stripped.startswith("with "):  # profiling scopes (record_function_or_nullcontext)
            out.append(" ".join(header))
        indent = own
        if stripped.startswith(("def ", "async def ", "class ")):
            break
    return out


def scope_of(line: str, definition: str | None, context: list[str] | tuple[str, ...] = ()) -> tuple[str, str]:
    """``("in", "")`` or ``("out", family)`` for a mutation on ``line`` inside ``definition``,
    under the block headers ``context`` (`enclosing_headers`)."""
    text = " ".join([definition or "", line, *context]).lower()
    for family, words in OUT_OF_SCOPE:
        if any(w in text for w in words):
            return "out", family
    stripped = line.strip()
    if stripped.startswith(("assert ", "raise ", "logger.", "log")):
        return "out", "assertion/logging"
    return "in", ""


def run_tool(tool_python: Path, args: list[str], stdin: str | None = None) -> Any:
    tool = Path(__file__).with_name("cosmic_tool.py")
    proc = subprocess.run([str(tool_python), str(tool), *args], input=stdin, capture_output=True, text=True,
                          cwd="/", check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"cosmic_tool {args[0]} failed: {tail[0]}")
    return json.loads(proc.stdout)


def enumerate_points(tool_python: Path, site: Path, files: tuple[str, ...] = FILES) -> list[dict]:
    points = run_tool(tool_python, ["enumerate", *OPERATORS, "--", *(str(site / f) for f in files)])
    for p in points:
        p["file"] = os.path.relpath(p.pop("path"), site)
    return points


def sample(points: list[dict], lines: dict[str, list[str]], count: int, seed: int) -> list[dict]:
    """``count`` descriptors, site first (module docstring), the same for the same points and seed."""
    rng = random.Random(seed)
    by_site: dict[tuple, list[dict]] = defaultdict(list)
    for p in points:
        by_site[(p["file"], *p["start"], *p["end"])].append(p)
    sites = sorted(by_site)
    chosen: list[tuple] = []
    for file in sorted({s[0] for s in sites}):
        own = [s for s in sites if s[0] == file]
        chosen += rng.sample(own, min(MIN_SITES_PER_FILE, len(own)))
    rest = [s for s in sites if s not in set(chosen)]
    chosen += rng.sample(rest, max(0, min(count - len(chosen), len(rest))))
    out = []
    for site in sorted(chosen):
        p = rng.choice(by_site[site])
        line = lines[p["file"]][p["start"][0] - 1]
        scope, reason = scope_of(line, p["definition"], enclosing_headers(lines[p["file"]], p["start"][0])[:-1])
        out.append({"file": p["file"], "operator": p["operator"], "occurrence": p["occurrence"],
                    "line": p["start"][0], "col": p["start"][1], "end_line": p["end"][0], "end_col": p["end"][1],
                    "definition": p["definition"], "scope": scope, "scope_reason": reason,
                    "source_line": line.strip()[:160]})
    for index, d in enumerate(out):
        d["id"] = f"m{index:03d}"
    return out


def generate(tool_python: Path, venv: Path, count: int, seed: int, files: tuple[str, ...] = FILES) -> dict[str, Any]:
    """The versioned descriptor document for ``count`` mutants of ``files`` in ``venv``'s vLLM."""
    site = site_packages(venv)
    points = enumerate_points(tool_python, site, files)
    lines = {f: (site / f).read_text(encoding="utf-8").splitlines() for f in files}
    mutants = sample(points, lines, count, seed)
    sites = {(p["file"], *p["start"], *p["end"]) for p in points}
    return {"version": VERSION, "package": PACKAGE, "tool": "cosmic-ray==8.7.0", "seed": seed,
            "operators": list(OPERATORS), "files": {f: {"sha256": sha256(site / f)} for f in files},
            "population": {"mutation_points": len(points), "sites": len(sites)},
            "mutants": mutants}


def save(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise InputError("--descriptors", f"cannot read {path}: {err}") from None
    if doc.get("version") != VERSION:
        raise InputError("version", f"{path}: descriptor version {doc.get('version')!r}, expected {VERSION}")
    return doc


def check_installed(doc: dict[str, Any], site: Path) -> None:
    """Refuse a descriptor set made for another build of vLLM (the occurrences would point elsewhere)."""
    for file, meta in doc["files"].items():
        if sha256(site / file) != meta["sha256"]:
            raise InputError("files", f"{file}: installed source differs from the one the descriptors were made for")


def materialize(tool_python: Path, site: Path, mutants: list[dict], scratch: Path) -> dict[str, Path]:
    """Write each mutant's mutated file to ``scratch/<id>/<file>``; returns id -> overlay file
    (mutants whose mutation does not apply are left out)."""
    jobs = [{"path": str(site / m["file"]), "operator": m["operator"], "occurrence": m["occurrence"],
             "out": str(scratch / m["id"] / m["file"])} for m in mutants]
    done = run_tool(tool_python, ["apply"], stdin=json.dumps(jobs))
    return {m["id"]: Path(d["out"]) for m, d in zip(mutants, done, strict=True) if d["applied"]}


def module_name(file: str) -> str:
    """``vllm/v1/core/block_pool.py`` -> ``vllm.v1.core.block_pool``."""
    return file.removesuffix(".py").replace("/", ".")
