"""The Azure ML adapter against recorded Azure ML and MLflow responses, replayed over
HTTPS on loopback by ``tests/contract/case_azureml.py`` (the contract cases live there
too): what a user of ``--source azureml`` sees of their jobs, and how faults are borne."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import numpy as np
import pytest

from tests.contract.case_azureml import (
    NOW,
    RECORDINGS,
    RUNNING,
    Replay,
    StaticToken,
    adapter_for,
    start,
)
from trainguard.adapters.azureml import UNPARSED, from_options
from trainguard.adapters.base import AdapterError
from trainguard.checker.model import Job, JobState
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.stall import Stall

BRIGHT, QUIET, SLEEPY = ("bright_river_4k2m9x7q1z", "quiet_harbor_8w3n5c2v6b",
                         "sleepy_owl_2p7d4k9m3x")
LIST = "/workspaces/ws-research/jobs"


@pytest.fixture
def replay(request: pytest.FixtureRequest) -> Replay:
    return start(request)


def listed(replay: Replay) -> dict[str, Job]:
    return {j.id: j for j in adapter_for(replay).list_jobs(NOW)}


def one_page(*jobs: dict[str, Any]) -> dict[str, Any]:
    return {"value": list(jobs)}


def recorded_job(name: str = BRIGHT) -> dict[str, Any]:
    page = json.loads((RECORDINGS / "jobs_list_page1.json").read_text())
    return copy.deepcopy(next(j for j in page["value"] if j["name"] == name))


def test_a_running_job_is_normalised(replay: Replay) -> None:
    job = listed(replay)[BRIGHT]
    assert (job.provider, job.state, job.raw_state) == ("azureml", JobState.RUNNING, "Running")
    assert job.scope == "00000000-0000-0000-0000-000000000000/rg-training/ws-research"
    assert job.name == "resnet50 baseline"
    # The compute target's VM size, two nodes of two A100s each.
    assert (job.instance_type, job.instance_count, job.gpus_per_instance, job.gpu_count) == (
        "STANDARD_NC48ADS_A100_V4", 2, 2, 4)
    assert job.max_runtime_s == 2 * 86400  # limits.timeout P2D
    assert job.start_time == 1_750_000_000.0  # the MLflow run's start, not its creation
    assert job.tags == {"team": "vision", "project": "resnet50"}
    assert job.console_url is not None and job.console_url.startswith(
        "https://ml.azure.com/runs/bright_river_4k2m9x7q1z?wsid=")


def test_metric_history_is_read_across_pages_in_order(replay: Replay) -> None:
    job = listed(replay)[BRIGHT]
    loss, val = job.series["loss"], job.series["val_loss"]
    assert len(loss) == 30 and len(val) == 5  # 20 + 10 over two get-history pages
    assert np.all(np.diff(loss.time) > 0) and np.all(np.diff(loss.step) > 0)
    assert loss.time[0] == 1_750_000_045.0  # milliseconds became seconds
    assert loss.value[0] > loss.value[-1]
    pages = replay.calls("GET", "/metrics/get-history")
    assert [s.query.get("page_token") for s in pages if s.query["run_id"] == BRIGHT
            and s.query["metric_key"] == "loss"] == [None, "eyJvZmZzZXQiOjIwfQ=="]
    # every API call carries the token; the std_log blobs (SAS URLs) never do
    assert all(s.authorization == "Bearer replay-token" for s in replay.seen
               if not s.path.startswith("/blob/"))
    assert all(s.authorization is None for s in replay.seen if s.path.startswith("/blob/"))


def test_serverless_job_names_its_own_vm_size(replay: Replay) -> None:
    job = listed(replay)[QUIET]
    assert (job.instance_type, job.instance_count, job.gpus_per_instance) == (
        "Standard_NC24ads_A100_v4", 1, 1)
    assert job.series == {}  # its MLflow run has logged nothing yet
    assert job.max_runtime_s == 12 * 3600


def test_compute_is_asked_once_per_tick(replay: Replay) -> None:
    adapter = adapter_for(replay)
    adapter.list_jobs(NOW)  # two listed jobs run on gpu-a100
    assert len(replay.calls("GET", "/computes/gpu-a100")) == 1
    adapter.list_jobs(NOW + 60)
    assert len(replay.calls("GET", "/computes/gpu-a100")) == 2


def test_not_responding_job_is_watched_and_the_stall_rule_sees_it(replay: Replay) -> None:
    job = listed(replay)[SLEEPY]
    assert (job.state, job.raw_state) == (JobState.RUNNING, "NotResponding")
    last_loss = job.series["loss"].last_time
    assert [line.time for line in job.logs] == [last_loss]
    assert "heartbeat" in job.logs[0].text
    findings = Stall().check(job, Context(now=NOW, policy=Policy(), jobs=[job]))
    assert [f.rule for f in findings] == ["stall"]
    assert findings[0].started_at == last_loss


def test_not_responding_job_without_metrics_still_stalls(replay: Replay) -> None:
    replay.override("GET", "/runs/get", 200, json.loads(
        (RECORDINGS / "mlflow_run_quiet_harbor.json").read_text()))
    job = listed(replay)[SLEEPY]
    assert job.series == {}
    assert [line.time for line in job.logs] == [job.start_time]
    findings = Stall().check(job, Context(now=NOW, policy=Policy(), jobs=[job]))
    assert findings and findings[0].evidence["silence_s"] == pytest.approx(
        NOW - 1_750_000_000.0)


@pytest.mark.parametrize("status, watched", [
    ("Running", True), ("Finalizing", True), ("NotResponding", True),
    ("NotStarted", False), ("Starting", False), ("Provisioning", False),
    ("Preparing", False), ("Queued", False), ("Paused", False), ("CancelRequested", False),
    ("Completed", False), ("Failed", False), ("Canceled", False), ("Unknown", False),
    ("Hibernating", False),
])
def test_only_jobs_burning_compute_are_listed(replay: Replay, status: str,
                                              watched: bool) -> None:
    job = recorded_job()
    job["properties"]["status"] = status
    replay.override("GET", LIST, 200, one_page(job))
    jobs = adapter_for(replay).list_jobs(NOW)
    assert [(j.id, j.raw_state) for j in jobs] == ([(BRIGHT, status)] if watched else [])


@pytest.mark.parametrize("status, state", [
    ("Queued", JobState.PENDING), ("Paused", JobState.PENDING),
    ("Finalizing", JobState.RUNNING), ("CancelRequested", JobState.STOPPING),
    ("Completed", JobState.SUCCEEDED), ("Failed", JobState.FAILED),
    ("Canceled", JobState.STOPPED), ("Unknown", JobState.UNKNOWN),
])
def test_a_job_read_by_name_keeps_its_status(replay: Replay, status: str,
                                             state: JobState) -> None:
    job = recorded_job()
    job["properties"]["status"] = status
    replay.override("GET", f"{LIST}/{BRIGHT}", 200, job)
    got = adapter_for(replay).get_job(BRIGHT, NOW)
    assert got is not None and (got.state, got.raw_state) == (state, status)


def test_a_job_the_sdk_cannot_parse_is_reported_and_the_rest_listed(replay: Replay) -> None:
    bad = recorded_job(QUIET)
    bad["properties"]["limits"]["timeout"] = "soon"  # not an ISO 8601 duration
    replay.override("GET", LIST, 200, one_page(recorded_job(), bad))
    adapter = adapter_for(replay)
    assert [j.id for j in adapter.list_jobs(NOW)] == [BRIGHT]
    assert [e.ref for e in adapter.errors] == [UNPARSED]
    assert "1 listed job" in adapter.errors[0].reason


def test_a_bad_creation_time_names_the_field(replay: Replay) -> None:
    bad = recorded_job()
    bad["systemData"]["createdAt"] = "yesterday"
    replay.override("GET", LIST, 200, one_page(bad, recorded_job(QUIET)))
    adapter = adapter_for(replay)
    assert [j.id for j in adapter.list_jobs(NOW)] == [QUIET]
    assert adapter.errors[0].ref == BRIGHT
    assert "systemData.createdAt" in adapter.errors[0].reason
    assert "'yesterday'" in adapter.errors[0].reason


def test_throttling_is_retried_after_the_time_asked(replay: Replay) -> None:
    replay.fail("GET", LIST, 429, {"Retry-After": "1"})
    t0 = time.monotonic()
    assert set(listed(replay)) == RUNNING
    assert time.monotonic() - t0 >= 1.0
    assert len(replay.calls("GET", LIST)) == 3  # page 1 twice, then page 2


def test_server_errors_are_retried_on_every_service(replay: Replay) -> None:
    replay.fail("GET", LIST, 503)
    replay.fail("GET", "/computes/", 500)
    replay.fail("GET", "/runs/get", 502, times=2)
    replay.fail("GET", "/metrics/get-history", 504)
    adapter = adapter_for(replay)
    jobs = {j.id: j for j in adapter.list_jobs(NOW)}
    assert set(jobs) == RUNNING and adapter.errors[0].ref == "broken_kite_3x8v1n6m4c"
    assert len(adapter.errors) == 1
    assert jobs[BRIGHT].instance_type == "STANDARD_NC48ADS_A100_V4"
    assert len(jobs[BRIGHT].series["loss"]) == 30
    assert replay.faults == []


def test_one_jobs_metric_failure_does_not_stop_the_others(replay: Replay) -> None:
    replay.fail("GET", "/runs/get", 500, times=4)  # the first job's read and its 3 retries
    adapter = adapter_for(replay)
    jobs = {j.id: j for j in adapter.list_jobs(NOW)}
    assert set(jobs) == RUNNING  # still listed: its state and cost count without metrics
    assert jobs[BRIGHT].series == {}
    assert len(jobs[SLEEPY].series["loss"]) == 5
    metric_errors = [e for e in adapter.errors if e.reason.startswith("metrics not read")]
    assert [e.ref for e in metric_errors] == [BRIGHT]
    assert "runs/get: HTTP 500" in metric_errors[0].reason


def test_a_listing_that_keeps_failing_fails_the_source(replay: Replay) -> None:
    replay.fail("GET", LIST, 500, times=10)
    with pytest.raises(AdapterError, match="cannot list jobs in 00000000-"):
        adapter_for(replay).list_jobs(NOW)


def test_cancel_is_posted_and_not_polled(replay: Replay) -> None:
    adapter = adapter_for(replay)
    job = listed(replay)[BRIGHT]
    adapter.stop(job, "stall: no progress for 40 min")
    posts = replay.calls("POST", "/cancel")
    assert [p.path.rsplit("/", 2)[-2] for p in posts] == [BRIGHT]
    assert posts[0].authorization == "Bearer replay-token"
    assert posts[0].query["api-version"]
    assert replay.calls("GET", "/mfeOperationResults/") == []


@pytest.mark.parametrize("opts, message", [
    ({"resource_group": "rg", "workspace": "ws"}, "option subscription is required"),
    ({"subscription": "s", "resource_group": "rg", "workspace": "ws", "region": "x"},
     "unknown option 'region'"),
    ({"subscription": "s", "resource_group": "rg", "workspace": "ws",
      "endpoint": "http://127.0.0.1:1"}, "must be https"),
    ({"subscription": "s", "resource_group": "rg", "workspace": "ws", "retries": "many"},
     "option retries or backoff"),
])
def test_bad_options_say_which(opts: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_options(opts, credential=StaticToken())


def test_the_cli_source_factory_builds_it(replay: Replay, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--source azureml --opt ...`` goes through ``adapters.sources.build``; with no
    Azure AD here, DefaultAzureCredential is the one part replaced."""
    from trainguard.adapters.sources import build

    monkeypatch.setattr("azure.identity.DefaultAzureCredential", StaticToken)
    adapter = build("azureml", {
        "subscription": "00000000-0000-0000-0000-000000000000",
        "resource_group": "rg-training", "workspace": "ws-research",
        "endpoint": replay.base, "ca_file": replay.ca_file, "backoff": "0.01"})
    assert {j.id for j in adapter.list_jobs(NOW)} == RUNNING


# --- the job's own std_log files (compute clusters send no stdout to Log Analytics) --------

HISTORY = ("/history/v1.0/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/"
           "rg-training/providers/Microsoft.MachineLearningServices/workspaces/ws-research/runs")


def failing_logs(replay: Replay, url: str) -> None:
    """bright_river's run details name one std_log file at ``url`` (a SAS URL)."""
    replay.override("GET", f"{HISTORY}/{BRIGHT}/details", 200, {
        "runId": BRIGHT, "logFiles": {"user_logs/std_log_process_1.txt": url,
                                      "system_logs/cs_capability/cs-capability.log": url}})


def test_a_signature_in_std_log_reaches_the_job_dated_by_the_blob(replay: Replay) -> None:
    failing_logs(replay, f"{replay.base}/blob/failing/user_logs/std_log_process_1.txt?sig=x")
    adapter = adapter_for(replay)
    jobs = {j.id: j for j in adapter.list_jobs(NOW)}
    lines = [line for line in jobs[BRIGHT].logs if "CUDA out of memory" in line.text]
    assert len(lines) == 1
    # dated at the blob's Last-Modified (15 Jun 2025 15:05:00 UTC), never at the tick
    assert lines[0].time == 1749999900.0
    # only signature lines are kept: the step lines and the file's path line are not
    assert all("step" not in line.text for line in jobs[BRIGHT].logs)
    [blob] = replay.calls("GET", "/blob/failing/")
    assert blob.authorization is None, "the SAS URL is fetched without the bearer token"
    assert [c.path for c in replay.calls("GET", "cs-capability")] == []
    assert [e.ref for e in adapter.errors] == ["broken_kite_3x8v1n6m4c"]  # the recorded one


def test_the_recorded_jobs_logs_are_read_with_nothing_to_report(replay: Replay) -> None:
    adapter = adapter_for(replay)
    jobs = {j.id: j for j in adapter.list_jobs(NOW)}
    assert len(replay.calls("GET", "/details")) == len(RUNNING)
    assert len(replay.calls("GET", "/blob/")) == 4  # bright_river has two processes
    assert all(j.logs == [] or j.raw_state == "NotResponding" for j in jobs.values())


def test_a_log_url_off_the_clouds_storage_is_not_fetched(replay: Replay) -> None:
    """Attack: a forged logFiles entry must not make the watchdog fetch another host."""
    failing_logs(replay, "https://attacker.example.com/user_logs/std_log.txt?sig=x")
    adapter = adapter_for(replay)
    jobs = {j.id: j for j in adapter.list_jobs(NOW)}
    assert BRIGHT in jobs and jobs[BRIGHT].series  # the job is kept, its metrics read
    [error] = [e for e in adapter.errors if e.ref == BRIGHT]
    assert "not on a storage host" in error.reason


def test_run_history_failing_keeps_the_job_and_says_why(replay: Replay) -> None:
    replay.fail("GET", f"{BRIGHT}/details", 500, times=10)
    adapter = adapter_for(replay)
    jobs = {j.id: j for j in adapter.list_jobs(NOW)}
    assert BRIGHT in jobs and jobs[BRIGHT].series
    assert any(e.ref == BRIGHT and "logs not read" in e.reason for e in adapter.errors)
