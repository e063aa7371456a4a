"""The flows registry (conformance/flows/): every entry resolves, and the per-flow tables that
live elsewhere agree with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.flows import FLOW_IDS, FLOWS, get_flow, resolve
from spec.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("flow_id", FLOW_IDS)
def test_every_part_resolves(flow_id: str) -> None:
    flow = FLOWS[flow_id]
    assert flow.id == flow_id
    for part, ref in flow.refs().items():
        assert resolve(ref) is not None, (flow_id, part, ref)
    for test in flow.tests:
        assert (ROOT / test).exists(), (flow_id, test)


@pytest.mark.parametrize("flow_id", FLOW_IDS)
def test_profile_adapters_and_targets_exist(flow_id: str) -> None:
    from conformance.flows.profiles import get_profile
    from conformance.runner.adapter import BUILTIN
    from conformance.targets import TARGET_SPECS

    flow = FLOWS[flow_id]
    profile = get_profile(flow.profile)
    if profile.lockstep:
        assert resolve(profile.reference) is flow.make_reference()
    assert set(flow.adapters) <= set(BUILTIN)
    assert set(flow.targets) <= set(TARGET_SPECS)


def test_proof_flows_are_the_matrix_flows() -> None:
    from spec.proofs.matrix import FLOW_NAMES, flow

    assert {f.proof_flow for f in FLOWS.values() if f.proof_flow} == set(FLOW_NAMES)
    for f in FLOWS.values():
        if f.proof_flow:
            assert flow(f.proof_flow).encoder.__module__.startswith(f.proof_encoding)


def test_mutants_register_with_their_flow() -> None:
    from conformance.selftest.mutants import MUTANTS

    references = {f.make_reference(): f for f in FLOWS.values()}
    for mutant in MUTANTS.values():
        if mutant.reference is not None:
            # A mutant may be held to a variant of its flow's reference (async-frees-without-fence:
            # the deferred-free subclass of the async reference).
            flow = next(references[base] for base in mutant.reference.__mro__ if base in references)
            assert flow.profile == mutant.profile, mutant.name


def test_unknown_flow_is_one_line() -> None:
    with pytest.raises(InputError, match="flow"):
        get_flow("no-such-flow")


@pytest.mark.parametrize("flow_id", [f.id for f in FLOWS.values() if f.adapters])
def test_replay_uses_the_flows_own_lockstep_reference(flow_id: str, tmp_path, capsys) -> None:
    """``kvsched replay`` under a flow's profile steps the profile's reference beside the adapter,
    as ``conform`` does (it used the V0 reference, so every V1, nano or async replay diverged)."""
    from conformance.commands.cli import main
    from conformance.generation.v0 import sample_traces

    flow = FLOWS[flow_id]
    adapter = flow.adapters[0]
    for i, trace in enumerate(sample_traces(flow.trace_strategy(), 3, 11)):
        path = tmp_path / f"{i}.json"
        trace.save(path)
        code = main(["replay", str(path), "--adapter", adapter, "--profile", flow.profile])
        out = capsys.readouterr().out
        assert code == 0 and "LOCKSTEP" not in out, out[-600:]
