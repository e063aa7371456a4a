"""Mutant descriptors for vLLM's V1 scheduler stack: which seeded bug, where, never the mutated source.

A descriptor names one mutation of one file of the *installed* vLLM package: the file (relative
to site-packages), Cosmic Ray's operator and occurrence (`cosmic_tool.py` numbers them as
``cosmic-ray init`` does), the span, the enclosing function and the feature area of the mutated
line (`area_of`). The descriptor file also pins each file's sha256, so a descriptor set made for
one vLLM build refuses to apply to another. Applying a descriptor (`materialize`) writes the
mutated file into a scratch overlay directory; the installed package is never touched, and no
vLLM source is ever committed: only these descriptors are.

The population (issue 29) is the whole stack: the eight files of `FILES`, each given a share of
the mutants in proportion to its statements (largest remainder, at least one each), and inside a
file the sample is drawn site first (a site is one span of source): every site is equally likely,
whatever the number of operators that apply there, so a comparison with six replacement
operators weighs no more than a ``break``. Every mutant counts; the only ones left out of a rate
are those read as equivalent (`EQUIVALENT`, each with a reason a second reader can check), and a
mutant any judge kills is not equivalent, whatever its entry says (`summary`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

from conformance.selftest.mutation.equivalence import equivalence_of
from spec.errors import InputError

VERSION = 2
PACKAGE = "vllm==0.33.0"
# The scheduler stack: the scheduler, its pipelined subclass and its queues, the KV cache manager
# and the coordinator and per-group managers under it, the block pool, and the encoder cache.
FILES = (
    "vllm/v1/core/sched/scheduler.py",
    "vllm/v1/core/sched/async_scheduler.py",
    "vllm/v1/core/sched/request_queue.py",
    "vllm/v1/core/kv_cache_manager.py",
    "vllm/v1/core/kv_cache_coordinator.py",
    "vllm/v1/core/single_type_kv_cache_manager.py",
    "vllm/v1/core/block_pool.py",
    "vllm/v1/core/encoder_cache_manager.py",
)
POPULATION = 320  # mutants of the whole-stack sample (issue 29: at least 300)
SEED = 20261202
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

# Feature areas: a mutation on a line, in a function, under a block header that names one of a
# feature's words, or a condition whose every guarded statement does, is in that feature's area
# (checked in order; the first match wins). Most are features kvsched does not model: their
# mutants count in the population all the same, as survivors for kvsched where it cannot see
# them (issue 29). The table of kills per area (`summary`) shows where each judge is strong.
FEATURE_AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("spec-decode", ("spec_token", "spec_decode", "draft", "speculat", "eagle", "num_spec", "lookahead",
                     "rejected", "num_accepted")),
    ("kv-connector", ("connector", "kv_transfer", "remote", "recving", "sending", "kv_load", "invalid_block",
                      "load_kv", "xfer", "async_load", "kv_consumer", "kv_producer", "failed_recv", "kv_output",
                      "offload", "unpin", "pin_",
                      # called only by KV connectors: distributed/kv_transfer/kv_connector/v1/{mooncake,hf3fs,
                      # nixl} and scheduler.py:3377 (_connector_finished, which returns at once without one)
                      "get_unhashed_block_ids", "get_block_ids_for_computed_tokens",
                      # set only with a consumer KV connector and overlapping batches (scheduler.py:189-195)
                      "defer_block_free")),
    ("stale-output drop", (
        # request.drop_stale_output is set only by KV delivery (scheduler.py:975, requires_kv_delivery
        # from the connector), resumable session turns (scheduler.py:2728) and
        # reset_prefix_cache(reset_running_requests=True) (scheduler.py:3204), none of which kvsched drives
        "drop_stale_output",)),
    ("blocked waiting states", (
        # WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR / _REMOTE_KVS / _STREAMING_REQ (scheduler.py:2689-2694):
        # grammar compilation, KV connector loads and streaming input, none of which kvsched has
        "blocked_waiting",)),
    ("engine pause", (
        # EngineCore.pause_scheduler -> Scheduler.set_pause_state (v1/engine/core.py:980, 2215): an admin
        # state kvsched's protocol has no call for; only code that runs *in* a paused state (the
        # admission loop is itself under `_pause_state != PAUSED_ALL`, which is in scope)
        "== pausestate.paused", "set_pause_state")),
    ("per-request output payload", (
        # model_config.return_sampling_mask (vllm/config/model.py:284, scheduler.py:487, 2496): the output
        # payload the engine returns per request; the protocol carries scheduling decisions and state,
        # and the payload is the model runner's (docs/PROTOCOL.md "What is not observed")
        "sampling_mask",)),
    ("encoder/multimodal", ("encoder", "mm_", "multimodal", "mm_hash", "cross_attn")),
    ("structured-output", ("structured_output", "grammar", "bitmask", "reasoning")),
    ("lora", ("lora",)),
    ("stats/events/logging", ("stats", "metric", "logger", "log_", "kv_event", "events", "perf", "record_",
                              "iteration_details", "cudagraph", "num_cached_tokens", "get_usage")),
    ("hybrid/mamba/sliding-window", ("mamba", "sliding", "swa", "hybrid", "hisparse", "sparse", "group_id",
                                     "prefix_replay", "replay_",
                                     # sub-block hits: only with aligned Mamba states
                                     # (vllm/v1/core/kv_cache_utils.py: partial_hash_hits_enabled)
                                     "partial_block", "partial_hash",
                                     # CoW copies exist only for partial (sub-block) prefix hits
                                     # (single_type_kv_cache_manager.py: _apply_cow, "Redirect a partial
                                     # prefix-cache hit to a private CoW block")
                                     "cow_retained", "block_copies",
                                     # the junction pinned for a lagging sparse-retention group
                                     # (kv_cache_manager.py:319-325)
                                     "shared_prefix_boundary")),
    ("pooling/logprobs/streaming", ("pooling", "pooler", "logprobs", "streaming", "stream_", "resumable",
                                    "routed_expert", "repetition", "session")),
    ("parallelism", ("dp_", "data_parallel", "pipeline", "pp_", "dcp", "pcp", "ec_", "kv_sharing",
                     "num_reqs_to_pad",
                     # DP prefill balancing and the V2+PP+async decode throttle (scheduler.py:389-395)
                     "prefill_capacity_bound", "current_step", "throttle",
                     # the DP prefill cadence counter: read only against local_prefill_interval > 1
                     # (scheduler.py:780-790, 1621-1629)
                     "num_executed_steps", "prefill_interval")),
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


def guarded_body(lines: list[str], lineno: int) -> list[str]:
    """The statements of the block that line ``lineno`` (1-based) opens, when it is a one-line
    ``if``/``elif`` header; else nothing. A condition whose whole body is feature code
    (``if total > 0: self.num_executed_steps += 1``) belongs to that feature."""
    line = lines[lineno - 1]
    stripped = line.strip()
    if not stripped.startswith(("if ", "elif ")) or not stripped.split("#")[0].rstrip().endswith(":"):
        return []
    indent = len(line) - len(line.lstrip())
    body = []
    for text in lines[lineno:]:
        if not text.strip() or text.strip().startswith("#"):
            continue
        if len(text) - len(text.lstrip()) <= indent:
            break
        body.append(text.strip())
    return body


def _family(text: str) -> str | None:
    text = text.lower()
    return next((family for family, words in FEATURE_AREAS if any(w in text for w in words)), None)


# The area of a line no feature claims, by file: what kvsched's traces drive.
CORE_AREAS = {
    "vllm/v1/core/sched/scheduler.py": "scheduling core",
    "vllm/v1/core/sched/async_scheduler.py": "pipelined (async) scheduling",
    "vllm/v1/core/sched/request_queue.py": "request queues (FCFS / priority)",
    "vllm/v1/core/kv_cache_manager.py": "KV cache managers",
    "vllm/v1/core/kv_cache_coordinator.py": "KV cache managers",
    "vllm/v1/core/single_type_kv_cache_manager.py": "KV cache managers",
    "vllm/v1/core/block_pool.py": "block pool",
    # the whole file is the encoder (multimodal) cache and budget
    "vllm/v1/core/encoder_cache_manager.py": "encoder/multimodal",
}


def area_of(file: str, line: str, definition: str | None, context: list[str] | tuple[str, ...] = (),
            body: list[str] | tuple[str, ...] = ()) -> str:
    """The feature area of a mutation on ``line`` of ``file`` inside ``definition``, under the
    block headers ``context`` (`enclosing_headers`); ``body`` (`guarded_body`) gives a condition
    the area of its guarded statements when they all name one same feature. A label for the
    per-area table, never a reason to leave a mutant out."""
    if CORE_AREAS.get(file) == "encoder/multimodal":
        return "encoder/multimodal"
    family = _family(" ".join([definition or "", line, *context]))
    if family is not None:
        return family
    guarded = {_family(statement) for statement in body}
    if body and len(guarded) == 1 and None not in guarded:
        return guarded.pop()  # type: ignore[return-value]
    if line.strip().startswith(("assert ", "raise ", "logger.", "log")):
        return "assertions/logging"
    return CORE_AREAS.get(file, "scheduling core")


def reread(doc: dict[str, Any], site: Path) -> list[str]:
    """Apply today's area rules and equivalence verdicts to a descriptor document in place (the
    sample itself, drawn from the seed, is unchanged); the ids whose area or verdict changed."""
    lines = {f: (site / f).read_text(encoding="utf-8").splitlines() for f in doc["files"]}
    changed = []
    for m in doc["mutants"]:
        src = lines[m["file"]]
        area = area_of(m["file"], src[m["line"] - 1], m["definition"], enclosing_headers(src, m["line"])[:-1],
                       guarded_body(src, m["line"]))
        equivalent = equivalence_of(m)
        if (area, equivalent) != (m["area"], m.get("equivalent", "")):
            changed.append(m["id"])
        m["area"] = area
        if equivalent:
            m["equivalent"] = equivalent
        else:
            m.pop("equivalent", None)
    return changed


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


def statements(source: str) -> int:
    """The statements of a module (every ``ast.stmt`` node, nested ones included)."""
    return sum(isinstance(node, ast.stmt) for node in ast.walk(ast.parse(source)))


def shares(weights: dict[str, int], count: int) -> dict[str, int]:
    """``count`` split in proportion to ``weights`` by largest remainder, at least one each
    (ties broken by name, so the split is the same every time)."""
    total = sum(weights.values())
    exact = {k: count * w / total for k, w in weights.items()}
    out = {k: max(1, int(v)) for k, v in exact.items()}
    by_remainder = sorted(weights, key=lambda k: (-(exact[k] - int(exact[k])), k))
    for k in by_remainder:
        if sum(out.values()) >= count:
            break
        out[k] += 1
    return out


def sample(points: list[dict], lines: dict[str, list[str]], count: int, seed: int) -> list[dict]:
    """``count`` descriptors, each file's share by its statements (`shares`) and site first inside
    a file (module docstring); the same for the same points, sources and seed."""
    rng = random.Random(seed)
    by_site: dict[tuple, list[dict]] = defaultdict(list)
    for p in points:
        by_site[(p["file"], *p["start"], *p["end"])].append(p)
    files = sorted({p["file"] for p in points})
    quota = shares({f: statements("\n".join(lines[f])) for f in files}, count)
    chosen: list[tuple] = []
    for file in files:
        own = sorted(s for s in by_site if s[0] == file)
        chosen += rng.sample(own, min(quota[file], len(own)))
    out = []
    for site in sorted(chosen):
        p = rng.choice(by_site[site])
        src = lines[p["file"]]
        line = src[p["start"][0] - 1]
        area = area_of(p["file"], line, p["definition"], enclosing_headers(src, p["start"][0])[:-1],
                       guarded_body(src, p["start"][0]))
        out.append({"file": p["file"], "operator": p["operator"], "occurrence": p["occurrence"],
                    "line": p["start"][0], "col": p["start"][1], "end_line": p["end"][0], "end_col": p["end"][1],
                    "definition": p["definition"], "area": area, "source_line": line.strip()[:160]})
    for index, d in enumerate(out):
        d["id"] = f"m{index:03d}"
    return out


def subsample(mutants: list[dict], count: int, seed: int) -> list[dict]:
    """A quick look (``--sample N``): ``count`` of ``mutants``, each file's share by its number of
    mutants (at least one each), seeded; in id order."""
    rng = random.Random(seed)
    files = sorted({m["file"] for m in mutants})
    quota = shares({f: sum(m["file"] == f for m in mutants) for f in files}, count)
    chosen = []
    for f in files:
        own = [m for m in mutants if m["file"] == f]
        chosen += rng.sample(own, min(quota[f], len(own)))
    return sorted(chosen, key=lambda m: m["id"])


def judging_order(mutants: list[dict], seed: int) -> list[dict]:
    """``mutants`` in the order a run judges them: each file's shuffled (seeded), the files
    interleaved by their share, so that the mutants judged so far by a run that stops early are
    a seeded sample of the population, each file in proportion (not the first files whole and the
    last not at all)."""
    rng = random.Random(seed)
    ranked = []
    for f in sorted({m["file"] for m in mutants}):
        own = sorted((m for m in mutants if m["file"] == f), key=lambda m: m["id"])
        rng.shuffle(own)
        ranked += [((i + 0.5) / len(own), f, m["id"], m) for i, m in enumerate(own)]
    return [m for *_, m in sorted(ranked, key=lambda r: r[:3])]


def generate(tool_python: Path, venv: Path, count: int, seed: int, files: tuple[str, ...] = FILES) -> dict[str, Any]:
    """The versioned descriptor document for ``count`` mutants of ``files`` in ``venv``'s vLLM."""
    site = site_packages(venv)
    points = enumerate_points(tool_python, site, files)
    lines = {f: (site / f).read_text(encoding="utf-8").splitlines() for f in files}
    mutants = sample(points, lines, count, seed)
    sites = {(p["file"], *p["start"], *p["end"]) for p in points}
    for m in mutants:
        equivalent = equivalence_of(m)
        if equivalent:
            m["equivalent"] = equivalent
    return {"version": VERSION, "package": PACKAGE, "tool": "cosmic-ray==8.7.0", "seed": seed,
            "operators": list(OPERATORS),
            "files": {f: {"sha256": sha256(site / f), "statements": statements("\n".join(lines[f])),
                          "mutants": sum(m["file"] == f for m in mutants)} for f in files},
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
