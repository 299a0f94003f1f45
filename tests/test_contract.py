"""Every adapter, the in-memory one included, behaves the same way at its boundary:
it lists the running jobs, normalises them, reads their metrics, stops one, keeps an
unknown state as UNKNOWN with the raw value, and skips a malformed job while
reporting it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.contract import ContractCase, load_cases
from trainguard.adapters.base import AdapterError
from trainguard.checker.model import JobState

CASES = load_cases()


@pytest.fixture(params=sorted(CASES))
def contract(request: pytest.FixtureRequest) -> ContractCase:
    return CASES[request.param](request)


def test_lists_exactly_the_running_jobs(contract: ContractCase) -> None:
    # a malformed job may be listed too, as UNKNOWN (test_malformed_job_is_skipped...)
    jobs = [j for j in contract.adapter.list_jobs(contract.now) if j.id != contract.broken]
    assert {j.id for j in jobs} == contract.running
    for j in jobs:
        assert j.provider == contract.adapter.provider
        assert j.state is JobState.RUNNING
        assert j.raw_state, "the provider's own status is kept"
        assert j.scope, "a job says which account, workspace or namespace it is in"


def test_reads_metrics(contract: ContractCase) -> None:
    jobs = {j.id: j for j in contract.adapter.list_jobs(contract.now)}
    s = jobs[contract.with_metrics].series[contract.metric]
    assert len(s) > 0
    assert np.all(np.diff(s.time) >= 0), "series come sorted by time"


def test_unknown_state_is_unknown_with_raw_value_kept(contract: ContractCase) -> None:
    job = contract.adapter.get_job(contract.unknown_state, contract.now)
    assert job is not None
    assert job.state is JobState.UNKNOWN
    assert contract.unknown_raw in job.raw_state


def test_malformed_job_is_skipped_and_reported(contract: ContractCase) -> None:
    if contract.broken is None:
        pytest.skip(f"{contract.adapter.provider}: its service cannot hold a malformed job")
    jobs = contract.adapter.list_jobs(contract.now)
    # skipped, or listed as UNKNOWN (no rule judges it, nothing stops it; issue 12)
    listed = {j.id: j for j in jobs}
    assert contract.broken not in listed or listed[contract.broken].state is JobState.UNKNOWN
    assert [e.ref for e in contract.adapter.errors] == [contract.broken]
    assert contract.adapter.errors[0].reason


def test_stops_the_job_it_is_asked_to(contract: ContractCase) -> None:
    jobs = {j.id: j for j in contract.adapter.list_jobs(contract.now)}
    target = jobs[contract.with_metrics]
    if not contract.adapter.can_stop:
        # A read-only source says so clearly and stops nothing.
        with pytest.raises(AdapterError, match=r"\S"):
            contract.adapter.stop(target, "contract test")
        assert contract.stops() == []
        return
    contract.adapter.stop(target, "contract test")
    assert contract.stops() == [contract.with_metrics]
