"""kvsched testing itself: not part of what a user of the conformance suite calls.

The public surface of `conformance` is the adapter protocol (`adapter`, `wire`), the runner (`fuzz`,
`driver`, `isolated`, `workers`, `cluster`), its reports (`report`, `summary`, `html_view`), the CLI
and the pytest plugin. What lives here exists to show that the checks have teeth and that the
documents say what the code does:

* `mutants`, `mutants_v1`, `mutants_async`: deliberately broken references, one per invariant at
  least (a check no mutant fails is untested);
* `museum`: public scheduler bugs re-created as mutants, each with its upstream issue or PR;
* `docs_gen`: the generated documents (docs/INVARIANTS.md and friends) and their currency check;
* `proof_bridge`: Z3 counterexamples turned into replayable traces on the reference;
* `mutation`: the mutation benchmark on a real engine (seeded bugs in the installed vLLM, judged by
  kvsched and by the engine's own tests; benchmarks/bench_mutation_vllm.py);
* `async_checks`, `async_safety_gaps`: the pipelined flow's drafts and its audit of `safety`.
"""
