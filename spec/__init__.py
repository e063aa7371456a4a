"""kvsched's specification: the single source of truth.

Types and config (`spec.config`, `spec.types`, `spec.status`), what can be observed
(`spec.observation`), the scheduler interface (`spec.protocol`), traces (`spec.trace`), the
invariant catalogue (`spec.catalogue`) and the request lifecycle graph (`spec.lifecycle`).
This package imports nothing from the rest of kvsched.
"""
