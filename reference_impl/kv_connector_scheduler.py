"""The KV-connector flow's reference: `V1Scheduler` with ``config.kv_connector`` (the connector's
story is in `reference_impl.kv_connector`). A name for the flow registry, as
`reference_impl.specdec_scheduler` is for speculative decoding; a config without a connector
runs the plain V1 flow."""

from __future__ import annotations

from reference_impl.v1_scheduler import EngineWatermarkV1, V1Scheduler


class ConnectorScheduler(V1Scheduler):
    """vLLM V1's flow with a KV connector (spec/connector.py)."""


class EngineConnectorV1(EngineWatermarkV1):
    """The connector reference in vLLM 0.33.0's own terms, for lockstep against the engine: V1's
    watermark rule (`EngineWatermarkV1`), the failed-load blocks kept in the prefix cache under
    the recompute policy (`ConnectorFlow.keeps_failed_blocks_cached`), and a retried load's own
    blocks in its reservation (`ConnectorFlow.reserves_own_blocks`)."""

    keeps_failed_blocks_cached = True
    reserves_own_blocks = True
