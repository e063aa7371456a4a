"""docs/ADAPTERS.md lists every field of the types an adapter builds and of ConfigDomain, read
from the code (conformance/selftest/field_docs.py); a field without a comment cannot be documented."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conformance.selftest.field_docs import field_table
from spec.domain import ConfigDomain
from spec.observation import SeqView, Snapshot
from spec.types import Finished, Preempted, Request, ScheduledSeq, SchedulerOutput, StepOutcome

ADAPTERS = (Path(__file__).parent.parent / "docs" / "ADAPTERS.md").read_text()
TYPES = (Request, ScheduledSeq, Preempted, SchedulerOutput, StepOutcome, Finished, SeqView, Snapshot, ConfigDomain)


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__name__)
def test_every_field_has_its_row(cls):
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(cls._fields)
    for name in names:
        assert f"| `{name}` |" in ADAPTERS, f"{cls.__name__}.{name} is not in docs/ADAPTERS.md"


def test_a_field_without_a_comment_is_refused():
    @dataclasses.dataclass
    class Undocumented:
        documented: int = 0  # says what it is
        silent: int = 1

    with pytest.raises(ValueError, match="silent has no comment"):
        field_table(Undocumented)


def test_the_stop_token_and_the_escape_hatch_are_documented():
    assert "generated_token(request, index, position)" in ADAPTERS
    assert "The escape hatch: `trace_strategy`" in ADAPTERS
