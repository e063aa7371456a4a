"""vLLM V1's flow with a KV connector: external KV loaded synchronously or asynchronously
(disaggregated prefill's decode side, offloading), failed loads recomputed or failed, finished
requests' blocks held for a send or a store (spec/connector.py, docs/CONNECTORS.md).

A feature of the V1 flow (DESIGN.md, 2026-12-02: today's vLLM is one flow with features): the
reference is `V1Scheduler` itself, which runs the connector path only with ``config.kv_connector``.
Its own record because its traces carry the connector's scripts, its profile leaves out the
policies a connector changes, and its mutants break the connector path, none of which the V1
flow's traces would reach."""

from conformance.flows.record import Flow

FLOW = Flow(
    id="connector",
    title="vLLM V1 with a KV connector (remote and offloaded KV loads, load failures, delayed frees)",
    reference="reference_impl.kv_connector_scheduler:ConnectorScheduler",
    traces="conformance.generation.connector:connector_traces",
    configs="conformance.generation.connector:connector_configs",
    profile="connector",
    invariant_families=("spec.invariants.connector",),
    mutants="conformance.selftest.mutants_connector",
    # vLLM 0.33.0 with a scripted KVConnectorBase_V1 through the same host (the config turns it on)
    targets=("vllm-v1",),
    lockstep="conformance.selftest.campaigns.lockstep_connector:main",
    deviations="conformance.selftest.campaigns.lockstep_connector:CLASSES",
    tests=("tests/test_connector_reference.py", "tests/test_connector_mutants.py", "tests/test_connector_target.py",
           "tests/test_connector_proofs.py"),
    extra={"hunt": "conformance.selftest.campaigns.connector_hunt:main"},
    proof_flow="connector",
)
