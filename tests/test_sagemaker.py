"""The SageMaker adapter against recorded SageMaker answers (botocore Stubber, or the
same recordings over HTTP where retries must run) and CloudWatch on a moto server."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from botocore.stub import Stubber

from tests.sagemaker_replay import (
    NOW,
    REGION,
    Recordings,
    ReplayStubber,
    SageMakerServer,
    adapter_for,
    aws_client,
    canonical,
    moto_server,
    parse,
    put_logs,
    put_metrics,
    recorded_answer,
    renamed_event,
    sagemaker_client,
    seed_once,
    stop_moto,
)
from trainguard.adapters.sagemaker import MalformedJob, from_options, parse_event
from trainguard.adapters.sagemaker import metrics as sm_metrics
from trainguard.adapters.sagemaker.clients import make_clients
from trainguard.adapters.sagemaker.logs import filter_pattern
from trainguard.checker.model import Job, JobState
from trainguard.checker.signatures import SIGNATURES

T0 = 1_750_000_000.0  # the recordings' CreationTime


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    yield moto_server()
    stop_moto()


@pytest.fixture
def seeded(moto_url: str) -> str:
    """moto holding llm-pretrain-a's loss, step and GPU series (the contract case's data)."""
    from tests.contract.case_sagemaker import seed
    seed_once(moto_url, "contract", seed)
    return moto_url


@pytest.fixture
def rec() -> Recordings:
    return Recordings()


# --- state and resources ----------------------------------------------------------------

@pytest.mark.parametrize(("job", "state", "raw"), [
    ("llm-pretrain-a", JobState.RUNNING, "InProgress/Training"),
    ("hetero-e", JobState.PENDING, "InProgress/Starting"),
    ("timeout-f", JobState.STOPPED, "Stopped/MaxRuntimeExceeded"),
    ("odd-d", JobState.UNKNOWN, "Suspended/Hibernating"),
])
def test_state_keeps_the_providers_words(rec: Recordings, moto_url: str, job: str,
                                         state: JobState, raw: str) -> None:
    got = adapter_for(ReplayStubber(sagemaker_client(), rec), moto_url).get_job(job, NOW)
    assert got is not None
    assert (got.state, got.raw_state) == (state, raw)


def test_unknown_secondary_status_under_in_progress_is_unknown(rec: Recordings,
                                                               moto_url: str) -> None:
    body = rec.body("describe-resnet-spot-b")
    body["SecondaryStatus"] = "Defragmenting"
    replay = ReplayStubber(sagemaker_client(), rec, overrides={
        ("DescribeTrainingJob", canonical({"TrainingJobName": "resnet-spot-b"})): body})
    job = adapter_for(replay, moto_url).get_job("resnet-spot-b", NOW)
    assert job is not None and job.state is JobState.UNKNOWN
    assert job.raw_state == "InProgress/Defragmenting"


def test_job_fields_from_describe_and_tags(rec: Recordings, moto_url: str) -> None:
    job = adapter_for(ReplayStubber(sagemaker_client(), rec), moto_url).get_job(
        "llm-pretrain-a", NOW)
    assert job is not None
    assert job.scope == "123456789012/us-east-1"
    assert (job.instance_type, job.instance_count, job.gpus_per_instance) == (
        "ml.p4d.24xlarge", 2, 8)
    assert job.start_time == T0 + 600 and job.end_time is None
    assert job.max_runtime_s == 86400
    # one Restarting transition; the spot job's Interrupted is not a restart
    assert (job.restarts, job.restart_times) == (1, [T0 + 5400])
    assert job.tags == {"team": "foundation", "trainguard:protect": "false"}
    assert job.console_url == ("https://us-east-1.console.aws.amazon.com/sagemaker/home"
                               "?region=us-east-1#/jobs/llm-pretrain-a")
    assert job.hourly_price is None  # the price book fills it


def test_heterogeneous_cluster_is_priced_by_its_gpu_group(rec: Recordings, moto_url: str) -> None:
    job = adapter_for(ReplayStubber(sagemaker_client(), rec), moto_url).get_job("hetero-e", NOW)
    assert job is not None
    assert (job.instance_type, job.instance_count, job.gpus_per_instance) == (
        "ml.g5.48xlarge", 2, 8)


def test_tags_are_reused_within_their_ttl(rec: Recordings, moto_url: str) -> None:
    replay = ReplayStubber(sagemaker_client(), rec)
    clock = [NOW]
    adapter = adapter_for(replay, moto_url, tags_ttl_s=600, clock=lambda: clock[0])
    adapter.list_jobs(NOW)
    adapter.list_jobs(NOW + 60)
    assert replay.count("ListTags") == 3  # a, b and the malformed c, once each
    clock[0] += 601
    adapter.list_jobs(NOW + 660)
    assert replay.count("ListTags") == 6


# --- listing, failures, stop -----------------------------------------------------------

def test_lists_every_page_and_reports_the_malformed_job(rec: Recordings, moto_url: str) -> None:
    replay = ReplayStubber(sagemaker_client(), rec)
    adapter = adapter_for(replay, moto_url)
    jobs = adapter.list_jobs(NOW)
    assert replay.count("ListTrainingJobs") == 2
    # the job that cannot be mapped is listed, never dropped: UNKNOWN with its reason
    assert sorted(j.id for j in jobs) == ["broken-c", "llm-pretrain-a", "resnet-spot-b"]
    broken = next(j for j in jobs if j.id == "broken-c")
    assert broken.state is JobState.UNKNOWN and broken.raw_state == "InProgress/Training"
    assert broken.failure_reason is not None and "ResourceConfig" in broken.failure_reason
    [error] = adapter.errors
    assert error.ref == "broken-c"
    assert "ResourceConfig" in error.reason and "InstanceType" in error.reason
    assert not replay.missing


def test_one_jobs_api_failure_does_not_stop_the_others(rec: Recordings, moto_url: str) -> None:
    replay = ReplayStubber(sagemaker_client(), rec)
    real = replay._queue

    def failing(params: dict[str, Any], model: Any, **kw: Any) -> None:
        if model.name == "DescribeTrainingJob" and params["TrainingJobName"] == "resnet-spot-b":
            replay.stubber.add_client_error("describe_training_job", "AccessDeniedException",
                                            "not allowed", http_status_code=400)
            return
        real(params=params, model=model, **kw)

    replay.client.meta.events.unregister("provide-client-params.sagemaker.*", real)
    replay.client.meta.events.register("provide-client-params.sagemaker.*", failing)
    adapter = adapter_for(replay, moto_url)
    jobs = adapter.list_jobs(NOW)
    # broken-c is listed UNKNOWN (mapped from its document); resnet-spot-b was not read
    assert sorted(j.id for j in jobs) == ["broken-c", "llm-pretrain-a"]
    assert sorted(e.ref for e in adapter.errors) == ["broken-c", "resnet-spot-b"]
    assert any("AccessDenied" in e.reason for e in adapter.errors)


def test_stop_calls_stop_training_job(rec: Recordings, moto_url: str) -> None:
    replay = ReplayStubber(sagemaker_client(), rec)
    adapter = adapter_for(replay, moto_url)
    job = adapter.get_job("resnet-spot-b", NOW)
    assert job is not None
    adapter.stop(job, "test")
    assert replay.stopped() == ["resnet-spot-b"]


# --- retries over HTTP ----------------------------------------------------------------

@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.mark.parametrize(("op", "faults"), [
    ("DescribeTrainingJob", [(400, "ThrottlingException"), (400, "ThrottlingException")]),
    ("ListTrainingJobs", [(503, "ServiceUnavailable"), (500, "InternalFailure")]),
])
def test_throttling_and_5xx_are_retried(rec: Recordings, moto_url: str, aws_env: None,
                                        op: str, faults: list[tuple[int, str]]) -> None:
    with SageMakerServer(recorded_answer(rec)) as server:
        server.faults[op] = list(faults)
        adapter = from_options({"region": REGION, "sagemaker_endpoint_url": server.url,
                                "cloudwatch_endpoint_url": moto_url,
                                "logs_endpoint_url": moto_url, "max_attempts": "4"})
        jobs = adapter.list_jobs(NOW)
    assert sorted(j.id for j in jobs) == ["broken-c", "llm-pretrain-a", "resnet-spot-b"]
    assert [e.ref for e in adapter.errors] == ["broken-c"]
    assert server.faults[op] == [], "every injected fault was answered"
    assert server.calls[op] == len(faults) + (3 if op == "DescribeTrainingJob" else 2)


def test_retries_give_up_after_max_attempts_and_only_that_job_is_lost(
        rec: Recordings, moto_url: str, aws_env: None) -> None:
    with SageMakerServer(recorded_answer(rec)) as server:
        # the first job described gets every fault; the other two are answered
        server.faults["DescribeTrainingJob"] = [(400, "ThrottlingException")] * 2
        adapter = from_options({"region": REGION, "sagemaker_endpoint_url": server.url,
                                "cloudwatch_endpoint_url": moto_url,
                                "logs_endpoint_url": moto_url, "max_attempts": "2"})
        jobs = adapter.list_jobs(NOW)
    assert sorted(j.id for j in jobs) == ["broken-c", "resnet-spot-b"]
    assert sorted(e.ref for e in adapter.errors) == ["broken-c", "llm-pretrain-a"]
    assert "ThrottlingException" in next(e.reason for e in adapter.errors
                                         if e.ref == "llm-pretrain-a")


def test_from_options_sets_retries_and_rejects_bad_options(aws_env: None) -> None:
    adapter = from_options({"region": "eu-west-1", "retry_mode": "adaptive",
                            "max_attempts": "5"})
    assert adapter.clients.sagemaker.meta.config.retries == {"mode": "adaptive",
                                                             "total_max_attempts": 5}
    assert adapter.clients.region == "eu-west-1"
    with pytest.raises(ValueError, match=r"unknown option.*regoin"):
        from_options({"regoin": "eu-west-1"})
    with pytest.raises(ValueError, match="period='soon' is not a number"):
        from_options({"period": "soon"})
    with pytest.raises(ValueError, match="retry_mode 'legacy'"):
        make_clients(region="eu-west-1", retry_mode="legacy")


# --- EventBridge ---------------------------------------------------------------------

def test_parse_event_reads_millisecond_times(rec: Recordings) -> None:
    job = parse_event(rec.event("event-llm-pretrain-a-training"))  # times as strings
    assert (job.id, job.state, job.raw_state) == ("llm-pretrain-a", JobState.RUNNING,
                                                  "InProgress/Training")
    assert job.start_time == T0 + 600
    assert job.restart_times == [T0 + 5400]
    assert job.tags == {"team": "foundation"}
    failed = parse_event(rec.event("event-resnet-spot-b-failed"))  # times as numbers
    assert failed.state is JobState.FAILED
    assert failed.end_time == T0 + 5400
    assert failed.failure_reason is not None and "CUDA out of memory" in failed.failure_reason


def test_malformed_events_give_a_clear_error(rec: Recordings) -> None:
    with pytest.raises(MalformedJob, match=r"event 9a8b7c6d.*TrainingStartTime.*'yesterday"):
        parse_event(rec.event("event-malformed"))
    other = rec.event("event-llm-pretrain-a-training")
    other["detail-type"] = "SageMaker Endpoint State Change"
    with pytest.raises(MalformedJob, match="detail-type"):
        parse_event(other)
    no_arn = rec.event("event-llm-pretrain-a-training")
    del no_arn["detail"]["TrainingJobArn"]
    with pytest.raises(MalformedJob, match="llm-pretrain-a: TrainingJobArn is missing"):
        parse_event(no_arn)


def test_no_describe_for_a_job_whose_state_came_by_event(rec: Recordings, seeded: str) -> None:
    replay = ReplayStubber(sagemaker_client(), rec)
    adapter = adapter_for(replay, seeded)
    adapter.remember_event(rec.event("event-llm-pretrain-a-training"))
    adapter.remember_event(rec.event("event-resnet-spot-b-failed"))
    jobs = {j.id: j for j in adapter.list_jobs(NOW)}
    described = [p["TrainingJobName"] for op, p in replay.calls if op == "DescribeTrainingJob"]
    assert described == ["broken-c"]
    # the event that says resnet-spot-b failed wins over the listing's InProgress
    assert jobs["resnet-spot-b"].state is JobState.FAILED
    assert jobs["llm-pretrain-a"].state is JobState.RUNNING
    assert "loss" in jobs["llm-pretrain-a"].series, "metrics are read for evented jobs too"
    # the next tick has no events: every job is described again
    adapter.list_jobs(NOW + 300)
    assert replay.count("DescribeTrainingJob") == 1 + 3


def test_an_ended_job_known_only_by_event_is_returned_once(rec: Recordings,
                                                           moto_url: str) -> None:
    replay = ReplayStubber(sagemaker_client(), rec)
    adapter = adapter_for(replay, moto_url)
    gone = renamed_event(rec, "event-resnet-spot-b-failed", "finished-g")
    adapter.remember_event(gone)
    first = {j.id: j for j in adapter.list_jobs(NOW)}
    assert first["finished-g"].state is JobState.FAILED
    assert "finished-g" not in {j.id for j in adapter.list_jobs(NOW + 300)}


# --- metrics --------------------------------------------------------------------------

def test_gpu_metrics_are_per_gpu_and_averaged_across_hosts(rec: Recordings,
                                                           moto_url: str) -> None:
    t = [NOW - 1200 + 60 * i for i in range(10)]
    seed_once(moto_url, "gpu-mean-x", lambda url: put_metrics(
        url, "gpu-mean-x", {"loss": [(x, 2.0) for x in t]},
        hosts={"algo-1": {"GPUUtilization": [(x, 800.0) for x in t],
                          "CPUUtilization": [(x, 300.0) for x in t]},
               "algo-2": {"GPUUtilization": [(x, 400.0) for x in t],
                          "CPUUtilization": [(x, 100.0) for x in t]}}))
    adapter = adapter_for(ReplayStubber(sagemaker_client(), rec), moto_url)
    adapter.remember_event(renamed_event(rec, "event-llm-pretrain-a-training", "gpu-mean-x"))
    [job] = adapter.read_jobs(["gpu-mean-x"], NOW)
    gpu = job.series["gpu_util"]
    assert list(gpu.time) == t
    # 8 GPUs per ml.p4d.24xlarge: 800 % is 100 per GPU, 400 % is 50; mean of hosts 75
    np.testing.assert_allclose(gpu.value, 75.0)
    np.testing.assert_allclose(job.series["cpu_util"].value, 200.0)  # vCPU sum, not scaled
    assert np.isnan(job.series["loss"].step).all(), "no step metric: no step axis"


def test_step_metric_gives_the_series_their_steps(rec: Recordings, seeded: str) -> None:
    adapter = adapter_for(ReplayStubber(sagemaker_client(), rec), seeded)
    job = adapter.get_job("llm-pretrain-a", NOW)
    assert job is not None
    loss, step = job.series["loss"], job.series["step"]
    np.testing.assert_array_equal(step.step, step.value)
    np.testing.assert_array_equal(loss.step, step.value)
    assert np.all(np.diff(loss.time) > 0)


def fake_job(i: int, hosts: int = 2) -> Job:
    return Job(id=f"job-{i}", provider="sagemaker", start_time=NOW - 3600,
               instance_type="ml.g5.12xlarge", instance_count=hosts, gpus_per_instance=4)


def test_queries_for_many_jobs_take_ceil_n_over_500_calls() -> None:
    jobs = [fake_job(i) for i in range(130)]  # 130 x (2 definitions + 3 x 2 hosts) = 1040
    queries = [q for j in jobs for q in sm_metrics.queries_for(
        j, ["loss", "step"], 2, NOW, 3 * 3600, 60)]
    assert len(queries) == 1040
    calls: list[int] = []

    class Recorder:
        def get_metric_data(self, **request: Any) -> dict[str, Any]:
            calls.append(len(request["MetricDataQueries"]))
            return {"MetricDataResults": []}

    sm_metrics.fetch(Recorder(), queries, NOW, 60)
    assert calls == [500, 500, 40] and len(calls) == math.ceil(1040 / 500)


def test_get_metric_data_follows_next_token(rec: Recordings) -> None:
    """moto's GetMetricData never pages, so paging is checked on the Stubber."""
    cw = aws_client("cloudwatch", "http://127.0.0.1:9")
    model = cw.meta.service_model
    job = fake_job(0, hosts=1)
    queries = sm_metrics.queries_for(job, ["loss"], 1, NOW, 3600, 60)
    ids = {q.metric: f"q{i}" for i, q in enumerate(sorted(queries, key=lambda q: q.start))}
    ts = [NOW - 120, NOW - 60]
    page1 = {"MetricDataResults": [{"Id": ids["loss"], "Label": "loss", "Timestamps": ts[:1],
                                    "Values": [2.5], "StatusCode": "PartialData"}],
             "NextToken": "page-2"}
    page2 = {"MetricDataResults": [{"Id": ids["loss"], "Label": "loss", "Timestamps": ts[1:],
                                    "Values": [2.4], "StatusCode": "Complete"}]}
    with Stubber(cw) as stub:
        stub.add_response("get_metric_data", parse("GetMetricData", page1, model))
        stub.add_response("get_metric_data", parse("GetMetricData", page2, model))
        data = sm_metrics.fetch(cw, queries, NOW, 60)
        stub.assert_no_pending_responses()
    series = sm_metrics.to_series(data)["job-0"]["loss"]
    assert list(series.time) == ts and list(series.value) == [2.5, 2.4]


# --- logs -----------------------------------------------------------------------------

def test_log_failure_lines_reach_the_right_job_once(rec: Recordings, moto_url: str) -> None:
    stream = "logs-h/algo-1-1750000000"
    seed_once(moto_url, "logs-h-1", lambda url: put_logs(url, stream, [
        (NOW - 600, "epoch 3 step 1200 loss=1.93"),
        (NOW - 590, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ]))
    replay = ReplayStubber(sagemaker_client(), rec)
    seen: list[dict[str, Any]] = []
    adapter = adapter_for(replay, moto_url)
    adapter.clients.logs.meta.events.register(
        "provide-client-params.cloudwatch-logs.FilterLogEvents",
        lambda params, **_: seen.append(dict(params)))
    adapter.remember_event(renamed_event(rec, "event-llm-pretrain-a-training", "logs-h"))
    [job] = adapter.read_jobs(["logs-h"], NOW)
    assert [line.text for line in job.logs] == [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    assert job.logs[0].time == NOW - 590
    put_logs(moto_url, stream, [(NOW + 30, "[rank3] Watchdog caught collective operation "
                                           "timeout: WorkNCCL(SeqNum=8812) ran for 600000 ms")])
    adapter.remember_event(renamed_event(rec, "event-llm-pretrain-a-training", "logs-h"))
    [job] = adapter.read_jobs(["logs-h"], NOW + 60)
    assert len(job.logs) == 2, "the earlier line is kept, not fetched twice"
    assert seen[1]["startTime"] > seen[0]["startTime"], "the second tick asks only since the first"
    assert seen[0]["filterPattern"] == filter_pattern()


def test_filter_pattern_holds_every_signature_literal() -> None:
    pattern = filter_pattern()
    for sig in SIGNATURES:
        for lit in sig.literals:
            assert f'?"{lit}"' in pattern
    assert len(pattern) <= 1024
