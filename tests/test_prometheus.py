"""The Prometheus source: mapping, HTTP faults, and reading back from a real Prometheus
(Debian package) jobs' series, real training curves included."""

from __future__ import annotations

import contextlib
import csv
import http.server
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from tests.contract.case_prometheus import contract_server
from tests.servers import Samples, Server, openmetrics, prometheus
from trainguard.adapters.base import AdapterError
from trainguard.adapters.local import load_run
from trainguard.adapters.prometheus import (
    MAX_POINTS,
    Mapping,
    MappingError,
    Metrics,
    PromClient,
    PrometheusAdapter,
    PrometheusError,
    RawSeries,
    from_options,
    load_mapping,
    series_for,
    step_for,
)
from trainguard.adapters.sources import build
from trainguard.checker.model import Job, JobState

# --- mapping ----------------------------------------------------------------------


def test_a_metric_name_gets_the_jobs_selector() -> None:
    m = load_mapping({"selector": '{job="trainguard-demo", run="{job_id}"}'})
    assert m.series_expr("loss", "r1") == 'trainguard_loss{job="trainguard-demo", run="r1"}'


def test_gpu_util_averages_the_gpus_of_the_jobs_pods() -> None:
    m = load_mapping({"series": {"gpu_util": {"metric": "DCGM_FI_DEV_GPU_UTIL",
                                              "match": 'pod=~"{job_id}-.*"',
                                              "aggregate": "avg"}}})
    assert m.series_expr("gpu_util", "r1") == 'avg(DCGM_FI_DEV_GPU_UTIL{pod=~"r1-.*"})'


def test_a_job_id_cannot_break_out_of_its_label_value() -> None:
    assert Mapping().series_expr("loss", 'x"} or up{a="') == \
        'trainguard_loss{run="x\\"} or up{a=\\""}'


@pytest.mark.parametrize(("doc", "where"), [
    ({"series": {"loss": {"metric": "not a name"}}}, "series.loss.metric"),
    ({"series": {"loss": {"metric": "m", "aggregate": "median"}}}, "series.loss.aggregate"),
    ({"selector": 'run="fixed"'}, "selector"),
    ({"history": "-5"}, "history"),
    ({"colour": "blue"}, "colour"),
])
def test_a_bad_mapping_file_names_the_file_and_field(tmp_path: Path, doc: dict[str, object],
                                                     where: str) -> None:
    path = tmp_path / "mapping.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(MappingError) as e:
        load_mapping(path)
    assert str(e.value).startswith(f"{path}: {where}: ")


@pytest.mark.parametrize("span", [60.0, 3600.0, 86_400.0, 30 * 86_400.0])
def test_range_step_keeps_a_query_within_11000_points(span: float) -> None:
    step = step_for(0.0, span)
    assert span / step + 1 <= MAX_POINTS
    assert step >= 1.0  # never finer than the mapping's min_step


# --- HTTP faults, against a scripted loopback server ----------------------------------


class Script(http.server.BaseHTTPRequestHandler):
    replies: ClassVar[list[tuple[int, dict[str, str], bytes]]] = []
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        status, headers, body = self.replies.pop(0) if self.replies else (
            200, {}, b'{"status":"success","data":{"resultType":"vector","result":[]}}')
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def scripted(*replies: tuple[int, dict[str, str], bytes]) -> Iterator[str]:
    Script.replies, Script.seen = list(replies), []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


OK_ONE: tuple[int, dict[str, str], bytes] = (
    200, {}, b'{"status":"success","data":{"resultType":"vector","result":'
             b'[{"metric":{"run":"j1"},"value":[1.0,"1"]}]}}')


def test_throttling_and_server_errors_are_retried_with_backoff() -> None:
    waits: list[float] = []
    with scripted((503, {}, b"unavailable"), (429, {"Retry-After": "2"}, b""), OK_ONE) as url:
        client = PromClient(url, backoff=0.5, sleep=waits.append)
        assert Metrics(client).job_ids(100.0) == ["j1"]
    assert client.calls == 3
    assert waits == [0.5, 2.0]  # doubled backoff, but the server's Retry-After wins


def test_retries_give_up_with_the_status_and_server() -> None:
    with scripted(*[(502, {}, b"bad gateway")] * 3) as url:
        client = PromClient(url, retries=2, sleep=lambda s: None)
        with pytest.raises(PrometheusError, match=r"HTTP 502 from http://127\.0\.0\.1"):
            client.query("up")
    assert client.calls == 3


def test_a_rejected_query_is_not_retried_and_says_why() -> None:
    body = b'{"status":"error","errorType":"bad_data","error":"1:5: parse error"}'
    with scripted((400, {}, body)) as url:
        client = PromClient(url, sleep=lambda s: None)
        with pytest.raises(PrometheusError, match="bad_data: 1:5: parse error"):
            client.query("up{")
    assert client.calls == 1


def test_an_unreachable_server_fails_the_whole_source() -> None:
    with scripted() as url:
        pass  # closed again: nothing listens there now
    adapter = PrometheusAdapter(Metrics(PromClient(url, retries=1, sleep=lambda s: None)))
    with pytest.raises(AdapterError, match=r"cannot list jobs.*cannot reach"):
        adapter.list_jobs(100.0)


# --- a real Prometheus: the contract's jobs ---------------------------------------------


@pytest.fixture
def contract(request: pytest.FixtureRequest) -> tuple[Server, float]:
    # Skips, naming the package, when prometheus is not installed.
    server = contract_server(request)
    return server, float(server.info["now"])


def test_gpu_util_is_the_mean_over_the_jobs_own_gpus(contract: tuple[Server, float]) -> None:
    server, now = contract
    job = from_options({"url": server.url}).get_job("a", now)
    assert job is not None
    assert job.raw_state == "Running" and job.state is JobState.RUNNING
    util = job.series["gpu_util"]
    assert len(util) > 0
    np.testing.assert_allclose(util.value, 70.0)  # GPUs at 90 and 50; b's idle GPU left out


def test_a_job_without_a_state_metric_is_running_while_it_reports(
        contract: tuple[Server, float]) -> None:
    server, now = contract
    adapter = from_options({"url": server.url})
    job = adapter.get_job("b", now)
    assert job is not None and (job.raw_state, job.state) == ("reporting", JobState.RUNNING)
    # Two hours on, b has written nothing for that long: Prometheus cannot say why.
    later = adapter.get_job("b", now + 7200)
    assert later is not None and (later.raw_state, later.state) == ("silent", JobState.UNKNOWN)


def test_a_finished_job_is_not_listed_but_reads_as_finished(
        contract: tuple[Server, float]) -> None:
    server, now = contract
    adapter = from_options({"url": server.url})
    assert "done" not in {j.id for j in adapter.list_jobs(now)}
    job = adapter.get_job("done", now)
    assert job is not None and job.state is JobState.SUCCEEDED


def test_a_series_two_exporters_write_is_reported_not_guessed(
        contract: tuple[Server, float]) -> None:
    server, now = contract
    adapter = from_options({"url": server.url})
    adapter.list_jobs(now)
    (error,) = adapter.errors
    assert error.ref == "broken"
    assert "'loss'" in error.reason and "gives 2 series" in error.reason
    assert "10.0.0.1:9091" in error.reason and "aggregate" in error.reason


def test_stop_is_refused_with_the_source_that_can_stop(contract: tuple[Server, float]) -> None:
    server, now = contract
    adapter = build("prometheus", {"url": server.url})
    job = adapter.get_job("a", now)
    assert job is not None
    with pytest.raises(AdapterError, match=r"cannot stop job 'a'.*kubeflow"):
        adapter.stop(job, "policy says stop")


def test_series_for_gives_what_the_adapter_reads(contract: tuple[Server, float]) -> None:
    server, now = contract
    series = series_for("a", server.url, end=now)
    job = from_options({"url": server.url}).get_job("a", now)
    assert job is not None and set(series) == set(job.series) == {"loss", "step", "gpu_util"}
    np.testing.assert_array_equal(series["loss"].value, job.series["loss"].value)


# --- a real Prometheus: real training curves ------------------------------------------


def shortest_logged_run(curves: Path) -> Path:
    """The modded-nanogpt run with the fewest steps among those logging train_loss."""
    rows = [r for r in csv.DictReader((curves / "labels.csv").open())
            if r["run"].startswith("modded-nanogpt/")]
    rows.sort(key=lambda r: (int(r["last_step"] or 10**9), r["run"]))
    for row in rows:
        if "train_loss:" in (curves / row["run"]).read_text():
            return curves / row["run"]
    pytest.skip("no modded-nanogpt run logs train_loss")


@dataclass
class Curves:
    server: Server
    now: float
    gpt: Job  # a modded-nanogpt run, as adapters.local read it
    gpt_t0: float  # the wall time its elapsed clock starts at
    gan: Job  # a genrisk GAN run that diverges


@pytest.fixture(scope="module")
def curves(curves_dir: Path) -> Iterator[Curves]:
    now = round(time.time() - 1, 3)
    gpt = load_run(shortest_logged_run(curves_dir))
    gan = load_run(curves_dir / "genrisk" / "version_0.csv")  # diverges: 1e24, then NaN
    assert gpt.clock == "elapsed" and gan.clock == "step"
    # Both runs end a minute before now; the GAN log has no times: one step per 10 s.
    gpt_t0 = now - 60 - max(float(s.time[-1]) for s in gpt.series.values())
    gan_end = max(float(s.step[-1]) for s in gan.series.values())
    names = {"train_loss": "trainguard_loss", "val_loss": "trainguard_val_loss",
             "step": "trainguard_step", "train_gen_loss": "trainguard_loss",
             "train_disc_loss": "trainguard_disc_loss"}
    samples: list[Samples] = [
        (names[k], {"run": "gpt"}, np.round(gpt_t0 + s.time, 3), s.value)
        for k, s in gpt.series.items() if k in names]
    samples += [(names[k], {"run": "gan"}, np.round(now - 60 - 10.0 * (gan_end - s.step), 3),
                 s.value) for k, s in gan.series.items() if k in names]
    with prometheus(openmetrics(samples)) as server:
        yield Curves(server, now, gpt, gpt_t0, gan)


def test_real_curves_come_back_sample_for_sample(curves: Curves) -> None:
    # A grid finer than the log's 0.11 s between steps: every sample comes back.
    mapping = load_mapping({"history": 600, "min_step": 0.1,
                            "series": {"loss": "trainguard_loss", "step": "trainguard_step",
                                       "val_loss": "trainguard_val_loss"}})
    adapter = PrometheusAdapter(Metrics(PromClient(curves.server.url), mapping))
    assert {j.id for j in adapter.list_jobs(curves.now)} == {"gpt", "gan"}
    gpt = adapter.get_job("gpt", curves.now)
    assert gpt is not None and gpt.clock == "wall"
    for ours, theirs in (("loss", "train_loss"), ("val_loss", "val_loss"), ("step", "step")):
        src = curves.gpt.series[theirs]
        got = gpt.series[ours]
        np.testing.assert_allclose(got.time, np.round(curves.gpt_t0 + src.time, 3),
                                   rtol=0, atol=1e-3)
        np.testing.assert_array_equal(got.value, src.value)
        np.testing.assert_array_equal(got.step, src.step)
    assert gpt.start_time == pytest.approx(float(gpt.series["step"].time[0]))


def test_a_diverged_curve_keeps_its_blow_up_and_nans(curves: Curves) -> None:
    mapping = load_mapping({"history": 7200, "min_step": 5,
                            "series": {"loss": "trainguard_loss", "step": "trainguard_step",
                                       "disc_loss": "trainguard_disc_loss"}})
    got = PrometheusAdapter(Metrics(PromClient(curves.server.url), mapping)).get_job(
        "gan", curves.now)
    assert got is not None
    for ours, theirs in (("loss", "train_gen_loss"), ("disc_loss", "train_disc_loss")):
        src = curves.gan.series[theirs]
        np.testing.assert_array_equal(got.series[ours].value, src.value)  # NaN == NaN
        np.testing.assert_array_equal(got.series[ours].step, src.step)
    disc = got.series["disc_loss"].value
    assert disc[0] > 1e24 and np.isnan(disc[1:]).all()  # the blow-up, then NaN throughout


def test_a_day_of_history_is_read_coarser_but_never_invented(curves: Curves) -> None:
    points: list[float] = []

    class Recording(PromClient):
        def query_range(self, expr: str, start: float, end: float,
                        step: float | None = None,
                        namespace: str | None = None) -> list[RawSeries]:
            assert step is not None
            points.append((end - start) / step + 1)
            return super().query_range(expr, start, end, step, namespace)

    # The default mapping reads a day of history.
    job = PrometheusAdapter(Metrics(Recording(curves.server.url))).get_job("gpt", curves.now)
    assert job is not None and points and max(points) <= MAX_POINTS
    src = curves.gpt.series["train_loss"]
    src_t = np.round(curves.gpt_t0 + src.time, 3)
    got = job.series["loss"]
    assert 10 < len(got) < len(src)  # one sample per ~8 s grid step, of ~0.17 s steps
    i = np.searchsorted(src_t, got.time - 5e-4)
    np.testing.assert_allclose(src_t[i], got.time, rtol=0, atol=1e-3)  # real sample times
    np.testing.assert_array_equal(src.value[i], got.value)  # with their own values
    np.testing.assert_array_equal(src.step[i], got.step)
