"""Cosmic Ray's operators as a library: list the mutation points of a file, and write mutated copies.

Runs with the Python of the mutation venv (``~/.cache/kvsched/mutation/venv``, cosmic-ray 8.7.0),
not kvsched's: it imports nothing of kvsched, and kvsched imports nothing of it. Why Cosmic Ray
and not mutmut: Cosmic Ray's unit of mutation is exactly our descriptor, ``(module, operator,
occurrence)`` with the source span, and ``cosmic_ray.mutating.mutate_code(source, operator,
occurrence)`` is a pure function from source text to mutated source text. mutmut 3 rewrites whole
files into trampolines and drives its own runner in a ``mutants/`` tree, which we could not point
at an installed package without copying it.

    python cosmic_tool.py enumerate OPERATOR... -- FILE...   # JSON list of mutation points on stdout
    python cosmic_tool.py apply < jobs.json                   # jobs: [{path, operator, occurrence, out}]

``apply`` writes each mutated file to ``out`` and prints, per job, whether the mutation applied.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def enumerate_points(operators: list[str], files: list[str]) -> list[dict]:
    """Every mutation point of ``operators`` in ``files``, in Cosmic Ray's own order: per file, per
    operator, occurrences in AST walk order (as ``cosmic-ray init`` numbers them)."""
    import cosmic_ray.plugins
    from cosmic_ray.ast import ast_nodes, get_ast_from_path
    from cosmic_ray.ast.ast_query import ASTQuery

    points: list[dict] = []
    for path in files:
        module_ast = get_ast_from_path(Path(path))
        nodes = list(ast_nodes(module_ast))
        for name in operators:
            operator = cosmic_ray.plugins.get_operator(name)()
            occurrence = 0
            for node in nodes:
                for start, end in operator.mutation_positions(node):
                    points.append({"path": path, "operator": name, "occurrence": occurrence,
                                   "start": list(start), "end": list(end),
                                   "definition": ASTQuery(node).get_definition_name()})
                    occurrence += 1
    return points


def apply_jobs(jobs: list[dict]) -> list[dict]:
    import cosmic_ray.plugins
    from cosmic_ray.mutating import mutate_code

    sources: dict[str, str] = {}
    done = []
    for job in jobs:
        source = sources.setdefault(job["path"], Path(job["path"]).read_text(encoding="utf-8"))
        operator = cosmic_ray.plugins.get_operator(job["operator"])()
        mutated = mutate_code(source, operator, job["occurrence"])
        if mutated is not None:
            out = Path(job["out"])
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(mutated, encoding="utf-8")
        done.append({"out": job["out"], "applied": mutated is not None and mutated != source})
    return done


def main(argv: list[str]) -> int:
    if argv[:1] == ["enumerate"] and "--" in argv:
        split = argv.index("--")
        json.dump(enumerate_points(argv[1:split], argv[split + 1:]), sys.stdout)
        return 0
    if argv[:1] == ["apply"]:
        json.dump(apply_jobs(json.load(sys.stdin)), sys.stdout)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
