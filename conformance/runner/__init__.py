"""The runner: how kvsched reaches a scheduler and checks it.

The adapter protocol and its loading (`adapter`), the adapter's own child process and the channel
to it (`isolated`, `worker`, `channel`, `guard`), one trace driven and checked (`driver`,
`normalize`, `lockstep`), the search over many traces (`fuzz`, `workers`), shrinking (`shrink`),
what a run reached (`coverage`), known failures (`expectations`), failures shared between runs
(`example_db`) and the plain-data verdict of one trace (`summary`). Nothing here imports
`conformance.selftest` (the import-linter contract in pyproject.toml).
"""
