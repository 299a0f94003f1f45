"""Every PromQL query of the generated Grafana dashboard, run on a real Prometheus that
scrapes a real Pushgateway holding what the runtimes really push:

* one real tick (``lambdas.tick``, the real rules) over a healthy and a diverging job,
  its metrics pushed by the Kubernetes runtime's own ``push_tick_metrics``;
* a training job's metrics pushed by ``trainguard.emit.PrometheusSink`` (what
  ``trainguard.emit`` pushes from inside a job);
* GPU metrics under the DCGM exporter's names and labels. No GPU and no DCGM exporter run
  here: these few gauges are pushed with prometheus-client in its place (the boundary),
  named and labelled as the exporter writes them with Kubernetes pod mapping on (``gpu``,
  ``UUID``, ``modelName``, ``Hostname``, and ``pod``/``namespace`` of the pod using the
  GPU; the PodMonitor keeps them with ``honorLabels``).

A query passes when Prometheus answers it with data; a per-rule tile of a rule that did
not fire passes when the metric and every label it names exist (its data is, rightly,
empty). A query naming a metric or label nobody writes fails.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

from tests.servers import Server, binary, free_port, pushgateway, start_server
from trainguard.checker.model import Action, Job, JobState, Series, Severity
from trainguard.checker.policy import Policy, RuleConfig, Safety
from trainguard.emit import PrometheusSink
from trainguard.lambdas.k8s.sinks import push_tick_metrics
from trainguard.lambdas.state import MemoryStore
from trainguard.lambdas.tick import TickReport, tick
from trainguard.stacks.dashboards import grafana

NS = "ml-team-a"
#: Grafana's own variables, as Grafana fills them before it sends a query
GRAFANA_VARS = {"$__interval": "1m", "$__rate_interval": "2m", "$__range": "1h"}
PROMQL_WORDS = {"sum", "avg", "min", "max", "count", "by", "without", "on", "ignoring",
                "and", "or", "unless", "offset", "max_over_time", "rate", "vector"}


class Source:
    name = "kubeflow"

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs, self.stopped = jobs, []  # type: list[Job], list[str]

    def list_jobs(self, now: float) -> list[Job]:
        return list(self.jobs)

    def stop(self, job: Job, reason: str) -> None:
        self.stopped.append(job.id)
        job.state = JobState.STOPPING


def training_job(name: str, loss: np.ndarray, now: float) -> Job:
    n = len(loss)
    t = np.asarray(now - 60.0 * (n - np.arange(n)), dtype=np.float64)
    steps = np.arange(n, dtype=np.float64) * 100
    return Job(id=f"{NS}/pytorchjob/{name}", provider="kubeflow", scope=f"lab/{NS}",
               name=name, state=JobState.RUNNING, start_time=float(t[0]) - 60,
               instance_count=2, gpus_per_instance=8, hourly_price=30.0,
               planned_steps=100_000,
               series={"loss": Series("loss", t, steps, loss),
                       "step": Series("step", t, steps, steps)})


def real_tick(now: float) -> tuple[TickReport, Source]:
    rng = np.random.default_rng(0)
    healthy = 2.0 * np.exp(-np.arange(120) / 40) + 0.3 + rng.normal(0, 0.01, 120)
    diverging = healthy.copy()
    diverging[-6:] = np.nan
    source = Source([training_job("bert-ok", healthy, now),
                     training_job("bert-nan", diverging, now)])
    policy = Policy(rules={"divergence": RuleConfig(actions={
        Severity.CRITICAL: Action.STOP, Severity.WARNING: Action.NOTIFY})},
        safety=Safety(dry_run=False, max_stops_per_tick=1, persist_ticks=1))
    report = tick([source], policy, MemoryStore(), [], now)
    return report, source


def push_dcgm(gateway: str) -> None:
    registry = CollectorRegistry()
    names = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
    gauges = {n: Gauge(n, n, ["gpu", "UUID", "modelName", "Hostname", "pod", "namespace",
                               "container"], registry=registry) for n in names}
    for host, pod, util in (("node-1", "bert-ok-worker-0", 93.0),
                            ("node-2", "bert-ok-worker-1", 41.0)):  # a straggler
        for gpu in range(2):
            labels = (str(gpu), f"GPU-{host}-{gpu}", "NVIDIA A100-SXM4-80GB", host, pod, NS,
                      "pytorch")
            gauges["DCGM_FI_DEV_GPU_UTIL"].labels(*labels).set(util)
            gauges["DCGM_FI_DEV_FB_USED"].labels(*labels).set(20_000.0)
            gauges["DCGM_FI_DEV_FB_FREE"].labels(*labels).set(61_920.0)
    push_to_gateway(gateway, job="dcgm-exporter", registry=registry)


def scraping_prometheus(target: str, pod_target: str) -> Any:
    """Prometheus scraping the Pushgateway (``honor_labels``: the pushed job and grouping
    labels stay, as on a real deployment) and one training pod's exporter, labelled with
    its pod and namespace as the stack's PodMonitor labels what it scrapes (no Kubernetes
    service discovery here: a static target stands in for it)."""
    exe = binary("prometheus")
    host = urllib.parse.urlparse(target).netloc

    def argv(port: int, wd: Path) -> list[str]:
        (wd / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n  - job_name: pushgateway\n    honor_labels: true\n"
            f"    static_configs: [{{targets: ['{host}']}}]\n"
            "  - job_name: training\n"
            f"    static_configs: [{{targets: ['{pod_target}'], labels: "
            f"{{pod: bert-ok-worker-1, namespace: {NS}}}}}]\n")
        return [exe, f"--config.file={wd / 'prometheus.yml'}",
                f"--storage.tsdb.path={wd / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]

    return start_server("prometheus", argv, "/-/ready")


def api(prom: Server, path: str, **params: str | list[str]) -> Any:
    query = urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(f"{prom.url}/api/v1/{path}?{query}", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[Server, TickReport, Source]]:
    now = time.time()
    report, source = real_tick(now)
    with ExitStack() as es:
        pg = es.enter_context(pushgateway())
        push_tick_metrics(pg.url, report, 0.5, time.time(), {"environment": "e2e"})
        sink = PrometheusSink("bert-ok", gateway=urllib.parse.urlparse(pg.url).netloc)
        sink.record(12_000, {"loss": 0.31, "throughput": 412.5}, time.time())
        push_dcgm(pg.url)
        port = free_port()
        scraped = PrometheusSink("bert-ok", port=port)  # the other pod: scraped
        es.callback(scraped.server[0].shutdown)
        scraped.record(11_800, {"loss": 0.32, "throughput": 205.0}, time.time())
        prom = es.enter_context(scraping_prometheus(pg.url, f"127.0.0.1:{port}"))
        deadline = time.monotonic() + 30
        wanted = ("trainguard_findings", "trainguard_throughput", "DCGM_FI_DEV_FB_FREE")
        while time.monotonic() < deadline:
            have = set(api(prom, "label/__name__/values"))
            pods = api(prom, "series", **{"match[]": 'trainguard_throughput{pod!=""}'})
            if all(w in have for w in wanted) and pods:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"Prometheus did not scrape the Pushgateway:\n{prom.log()[-2000:]}")
        yield prom, report, source


def dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for panel in grafana.dashboard_json()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


def names_in(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and label names a PromQL expression uses."""
    labels = {m for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
              for m in re.findall(r"\w+", group)}
    labels |= set(re.findall(r"(\w+)\s*(?:=~|!=|!~|=)\s*\"", expr))
    bare = re.sub(r"\b(?:by|without)\s*\([^)]*\)|\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    metrics = {w for w in re.findall(r"[A-Za-z_:][\w:]*", bare)
               if w not in PROMQL_WORDS}
    return metrics, labels


def test_a_real_tick_found_the_divergence_and_stopped_it(
        stack: tuple[Server, TickReport, Source]) -> None:
    """The data the dashboard is checked on is a real tick's, not made up for it."""
    _, report, source = stack
    assert source.stopped == [f"{NS}/pytorchjob/bert-nan"]
    assert {(f.rule, f.severity) for f in report.findings} >= {("divergence",
                                                               Severity.CRITICAL)}
    assert report.fleet.burn_usd_per_hour == pytest.approx(2 * 2 * 30.0)
    assert report.fleet.verdicts["critical"] == 1 and report.fleet.saved_usd > 0


@pytest.mark.parametrize("title_expr", dashboard_queries(), ids=lambda te: te[0])
def test_every_panel_query_reads_what_the_runtimes_write(
        stack: tuple[Server, TickReport, Source], title_expr: tuple[str, str]) -> None:
    prom, report, _ = stack
    title, expr = title_expr
    result = api(prom, "query", query=expr)["result"]
    fired = {f.rule for f in report.findings}
    rule = re.search(r'rule="(\w+)"', expr)
    if rule is None or rule.group(1) in fired:
        assert result, f"{title}: {expr} gives no data"
        return
    # a tile of a rule that did not fire: its metric and labels must still exist
    metrics, labels = names_in(expr)
    for metric in metrics:
        series = api(prom, "series", **{"match[]": metric})
        assert series, f"{title}: no metric {metric} in Prometheus"
        have = {k for s in series for k in s}
        assert labels <= have, f"{title}: {metric} has no label {labels - have}"


def test_the_check_fails_on_a_name_nobody_writes(
        stack: tuple[Server, TickReport, Source]) -> None:
    """The check above can fail: a misspelt metric or label gives no data."""
    prom, _, _ = stack
    assert not api(prom, "query", query="sum by (rule) (trainguard_finding)")["result"]
    metrics, labels = names_in('sum by (severity) (trainguard_findings{rulename="x"})')
    assert (metrics, labels) == ({"trainguard_findings"}, {"severity", "rulename"})
    have = {k for s in api(prom, "series", **{"match[]": "trainguard_findings"}) for k in s}
    assert "rulename" not in have


def test_the_straggler_and_the_savings_are_visible(
        stack: tuple[Server, TickReport, Source]) -> None:
    """The values, not only their presence: the per-host panel tells the slow host, the
    savings panel says what the stop saved, the verdicts panel counts the jobs."""
    prom, report, _ = stack
    queries = dict(dashboard_queries())
    per_host = {r["metric"]["Hostname"]: float(r["value"][1])
                for r in api(prom, "query", query=queries["GPU use per host"])["result"]}
    assert per_host == {"node-1": 93.0, "node-2": 41.0}
    (saved,) = api(prom, "query", query=queries["What stopping saved"])["result"]
    assert float(saved["value"][1]) == pytest.approx(report.fleet.saved_usd)
    assert saved["metric"]["dry_run"] == "false"
    verdicts = {r["metric"]["verdict"]: float(r["value"][1])
                for r in api(prom, "query", query=queries["Jobs by verdict"])["result"]}
    assert verdicts["critical"] == 1 and sum(verdicts.values()) == 2
    per_pod = {r["metric"].get("pod", ""): float(r["value"][1]) for r in api(
        prom, "query", query=queries["Throughput per host"])["result"]}
    assert per_pod == {"": 412.5, "bert-ok-worker-1": 205.0}  # pushed, and scraped per pod
    (mem,) = [r for r in api(prom, "query", query=queries["GPU memory"])["result"]
              if r["metric"]["pod"] == "bert-ok-worker-0"]
    assert float(mem["value"][1]) == pytest.approx(100 * 20_000 / 81_920)
