"""Issue 34 item 3: in a campaign of 300 traces of every domain of
`conformance.selftest.campaigns.length_reach.DOMAINS`, a request is preempted after a long output,
partial chunks of every small size occur, and a stop lands on a step that runs a partial chunk
(where the domain has chunked prefill and stops). About 3 s of CPU per domain."""

from __future__ import annotations

import pytest

from conformance.generation.domain import traces_in
from conformance.generation.v0 import sample_traces
from conformance.selftest.campaigns.length_reach import DOMAINS, count

CAMPAIGN = 300


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_a_campaign_reaches_long_outputs_chunks_and_stops_in_chunks(name):
    domain = DOMAINS[name]
    reach = count(domain, sample_traces(traces_in(domain), CAMPAIGN, 7))
    assert reach.traces == CAMPAIGN
    assert reach.gaps(domain) == [], (name, reach)
