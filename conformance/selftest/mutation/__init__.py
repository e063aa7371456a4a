"""Mutation benchmark on a real engine (issue 21, item 5): seeded bugs in vLLM 0.33.0's V1
scheduler, judged by kvsched's lockstep campaigns and by vLLM's own scheduler tests.

Not to be confused with `conformance.selftest.mutants` (kvsched's own seeded bugs in the *reference*,
one per invariant). Modules, in the order a run uses them:

* `workspace`: the cache directory with Cosmic Ray, pytest and vLLM's sdist tests;
* `descriptors`: which mutants (versioned JSON; never vLLM source), and `materialize` them;
* `cosmic_tool`: Cosmic Ray's operators, run in Cosmic Ray's own venv;
* `forks`, `forkserver`, `forkclient`: one vLLM import, one forked child per judged mutant;
* `kvsched_judge`, `pytest_judge` (+ its plugin `mutation_coverage`): the two judges;
* `summary`: kill rates. ``benchmarks/bench_mutation_vllm.py`` runs it all.

`cosmic_tool`, `forkserver`, `forkclient` and `mutation_coverage` run under other Pythons (the
tool venv, the target venv) and import nothing of kvsched.
"""
