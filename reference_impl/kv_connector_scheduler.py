"""The KV-connector flow's reference: `V1Scheduler` with ``config.kv_connector`` (the connector's
story is in `reference_impl.kv_connector`). A name for the flow registry, as
`reference_impl.specdec_scheduler` is for speculative decoding; a config without a connector
runs the plain V1 flow. `PipelinedConnectorScheduler` is the same flow with pipelined steps."""

from __future__ import annotations

from reference_impl.async_scheduler import DeferredFreeAsyncV1Scheduler
from reference_impl.v1_scheduler import EngineWatermarkV1, TrackedRequest, V1Scheduler


class ConnectorScheduler(V1Scheduler):
    """vLLM V1's flow with a KV connector (spec/connector.py)."""


class EngineConnectorV1(EngineWatermarkV1):
    """The connector reference in vLLM 0.33.0's own terms, for lockstep against the engine: V1's
    watermark rule (`EngineWatermarkV1`), the failed-load blocks kept in the prefix cache under
    the recompute policy (`ConnectorFlow.keeps_failed_blocks_cached`), a request sharing a failed
    block keeping it as computed (`ConnectorFlow.sharers_keep_failed_blocks`), and a retried load's own
    blocks in its reservation (`ConnectorFlow.reserves_own_blocks`)."""

    keeps_failed_blocks_cached = True
    sharers_keep_failed_blocks = True
    reserves_own_blocks = True
    chunks_recompute_without_chunked_prefill = True


class PipelinedConnectorScheduler(DeferredFreeAsyncV1Scheduler):
    """The pipelined flow with a KV connector: `AsyncV1Scheduler`'s steps (section 6 of its
    module docstring), fencing the frees of blocks an in-flight step still writes, as vLLM 0.33.0's
    ``AsyncScheduler`` does once a consumer connector may load into a freed block out of step order
    (``defer_block_free``, vllm/v1/core/sched/scheduler.py:189-195), and, as vLLM, not preempting a
    victim whose blocks would only be fenced."""

    def _preemption_frees(self, victim: TrackedRequest) -> bool:
        """A victim with a step in flight would only have its blocks fenced: it is not preempted,
        and the request that needs blocks waits for a later step (vLLM: "A deferred free will not
        help with immediate allocation", scheduler.py:940-942). A design that preempts it anyway
        and fences its blocks (`DeferredFreeAsyncV1Scheduler`) is as correct, only slower to free."""
        return not any(t is victim for step in self.in_flight for t, *_ in step.entries)


class EngineConnectorAsyncV1(PipelinedConnectorScheduler):
    """`PipelinedConnectorScheduler` in vLLM 0.33.0's own terms, for lockstep against its
    ``AsyncScheduler``: `EngineConnectorV1`'s knobs and V1's watermark rule (`EngineWatermarkV1`).
    vLLM's kept placeholders after a failed load (`AsyncV1Scheduler.keeps_failed_load_placeholders`)
    stay off: that is a defect, classified by its counterfactual
    (conformance/selftest/campaigns/lockstep_connector.py)."""

    keeps_failed_blocks_cached = True
    sharers_keep_failed_blocks = True
    reserves_own_blocks = True
    chunks_recompute_without_chunked_prefill = True
    _admission_watermark = EngineWatermarkV1._admission_watermark
    _never_fits_capacity = EngineWatermarkV1._never_fits_capacity
