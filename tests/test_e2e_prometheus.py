"""End to end on real Prometheus, Alertmanager and Pushgateway (Debian packages), all on
loopback: one CronJob tick over two Kubeflow jobs whose metrics are real training curves.

A diverging GAN run (genrisk version_0: 1e24, then NaN) and a healthy one (version_7) are
written into Prometheus as TSDB blocks with their own sample times (promtool, as
``tests/servers.py`` does: a Pushgateway would stamp every sample with the scrape time).
The Kubernetes API is the recorded server (``tests/k8s_replay.py``, no real cluster can
run here) listing two PyTorchJobs named after the runs, with the state ConfigMap beside
them. Alertmanager sends to a webhook receiver on loopback; the test asserts what that
receiver gets, what Alertmanager holds, the suspend the API server got, and what the
Pushgateway received.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.k8s_configmap import ConfigMapReplay
from tests.k8s_replay import RECORDINGS, serve
from tests.servers import Samples, Server, alertmanager, openmetrics, prometheus, pushgateway
from trainguard.adapters.local import load_run
from trainguard.lambdas.k8s.cronjob import main

pytestmark = [pytest.mark.realdata, pytest.mark.slow]

NS = "ml-team"
PTJ = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
DIVERGING, HEALTHY = "gan-diverging", "gan-healthy"
RUNS = {DIVERGING: "genrisk/version_0.csv", HEALTHY: "genrisk/version_7.csv"}
STEP_S = 10.0  # the CSV logs have no times: one step per 10 s, ending a minute before now
GROUP_WAIT_S = 1


@dataclass
class Webhook:
    """Alertmanager's webhook receiver: keeps every notification it is sent."""

    url: str = ""
    notifications: list[dict[str, Any]] = field(default_factory=list)

    def firing(self) -> dict[str, dict[str, Any]]:
        """Distinct firing alerts (by fingerprint) across every notification: labels."""
        out = {}
        for n in self.notifications:
            for a in n["alerts"]:
                if a["status"] == "firing":
                    out[a["fingerprint"]] = a
        return out


def webhook() -> Any:
    hook = Webhook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            hook.notifications.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_address[1]}/alerts"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    return hook, server


def am_config(url: str) -> str:
    return f"""
route:
  receiver: hook
  group_by: [alertname, job]
  group_wait: {GROUP_WAIT_S}s
  group_interval: 1s
  repeat_interval: 1h
receivers:
- name: hook
  webhook_configs:
  - url: {url}
    send_resolved: true
"""


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pytorchjob(name: str, started: float) -> dict[str, Any]:
    """The recorded bert-ft PyTorchJob, renamed and started when its run's curve starts."""
    item: dict[str, Any] = copy.deepcopy(json.loads(
        (RECORDINGS / "pytorchjobs-ml-team.json").read_text())["items"][0])
    item["metadata"]["name"] = name
    item["status"]["startTime"] = iso(started)
    for c in item["status"]["conditions"]:
        c["lastTransitionTime"] = c["lastUpdateTime"] = iso(started)
        c["message"] = c["message"].replace("bert-ft", name)
    return item


@dataclass
class Cluster:
    now: float
    prom: Server
    am: Server
    pg: Server
    hook: Webhook
    kube: ConfigMapReplay


@pytest.fixture
def cluster(curves_dir: Path) -> Iterator[Cluster]:
    now = round(time.time(), 3)
    samples: list[Samples] = []
    jobs = []
    for name, run in RUNS.items():
        job = load_run(curves_dir / run)
        last = float(job.series["step"].step[-1])
        for ours, theirs in (("trainguard_loss", "train_gen_loss"),
                             ("trainguard_disc_loss", "train_disc_loss"),
                             ("trainguard_step", "step")):
            s = job.series[theirs]
            # Prometheus sets ``namespace`` from the scrape target: the job's own.
            when = np.round(now - 60 - STEP_S * (last - s.step), 3)
            samples.append((ours, {"run": name, "namespace": NS}, when, s.value))
        jobs.append(pytorchjob(name, now - 60 - STEP_S * last))
    with ExitStack() as stack:
        hook, server = webhook()
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        prom = stack.enter_context(prometheus(openmetrics(samples)))
        am = stack.enter_context(alertmanager(am_config(hook.url)))
        pg = stack.enter_context(pushgateway())
        kube = ConfigMapReplay()
        stack.enter_context(serve(kube))
        kube.add_json("GET", PTJ, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJobList",
                                   "metadata": {"resourceVersion": "5"}, "items": jobs},
                      query={"limit": "500"})
        kube.add_json("GET", PODS, json.loads((RECORDINGS / "pods-empty.json").read_text()),
                      query={"labelSelector": "training.kubeflow.org/job-name", "limit": "500"})
        for item in jobs:
            kube.add_json("PATCH", f"{PTJ}/{item['metadata']['name']}", item)
            # the stop path reads the job again (its tags) just before suspending it
            kube.add_json("GET", f"{PTJ}/{item['metadata']['name']}", item)
        yield Cluster(now, prom, am, pg, hook, kube)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


def test_one_tick_alerts_once_for_the_diverging_job_and_never_for_the_healthy(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("series: {loss: trainguard_loss, disc_loss: trainguard_disc_loss, "
                       "step: trainguard_step}\nstate: ''\nhistory: 7200\nmin_step: 5\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text("name: e2e\nsafety: {dry_run: false, persist_ticks: 1, "
                      "max_stops_per_tick: 1}\nrules:\n  divergence: {actions: {critical: stop}}\n")
    env = {"KUBE_HOST": cluster.kube.host, "NAMESPACES": NS, "KINDS": "pytorchjob",
           "CLUSTER": "lab", "KUBE_RETRIES": "1", "KUBE_BACKOFF": "0",
           "STATE_CONFIGMAP": cluster.kube.ref, "POLICY": str(policy), "STOP_ENABLED": "true",
           "PROMETHEUS_URL": cluster.prom.url, "PROMETHEUS_MAPPING": str(mapping),
           "ALERTMANAGER_URL": cluster.am.url, "PUSHGATEWAY_URL": cluster.pg.url,
           "ENVIRONMENT": "e2e"}
    monkeypatch.delenv("TRAINGUARD_CONFIG", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(f"TRAINGUARD_{k}", v)

    assert main(["--now", str(cluster.now)]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])["tick"]
    # Both jobs were judged on their whole curves, read back from Prometheus.
    assert summary["metrics"] == {f"{NS}/pytorchjob/{name}": [
        "disc_loss:320", "loss:320", "step:320"] for name in RUNS}

    # Wait for the diverging job's notification, then long enough for any other group.
    deadline = time.monotonic() + 20
    while not cluster.hook.notifications and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3 * GROUP_WAIT_S + 1)
    firing = list(cluster.hook.firing().values())
    assert [a["labels"]["job"] for a in firing] == [DIVERGING], cluster.am.log()
    (alert,) = firing
    labels = alert["labels"]
    assert (labels["alertname"], labels["rule"], labels["severity"], labels["namespace"],
            labels["environment"]) == ("TrainguardDivergence", "divergence", "critical", NS,
                                       "e2e")
    assert "STOPPED the job" in alert["annotations"]["description"]
    assert alert["annotations"]["summary"].startswith("[trainguard] CRITICAL: divergence on")
    # Alertmanager itself holds exactly that one alert.
    held = json.loads(get(f"{cluster.am.url}/api/v2/alerts"))
    assert [a["labels"]["job"] for a in held] == [DIVERGING]

    # The diverging job, and only it, was suspended; its stop is remembered in the ConfigMap.
    (patch,) = cluster.kube.patches()
    assert patch.path == f"{PTJ}/{DIVERGING}"
    assert patch.body["spec"] == {"runPolicy": {"suspend": True}}
    stored = [json.loads(v) for k, v in cluster.kube.data.items() if k.startswith("job.")]
    stops = {m["job_id"]: m["stop"] is not None for m in stored}
    # A job with nothing to remember (the healthy one) may have no memory stored at all.
    assert stops[f"{NS}/pytorchjob/{DIVERGING}"] is True
    assert stops.get(f"{NS}/pytorchjob/{HEALTHY}", False) is False

    # The Pushgateway got the watchdog's own metrics.
    families = {f.name: f for f in text_string_to_metric_families(
        get(f"{cluster.pg.url}/metrics").decode())}
    found = {(s.labels["rule"], s.labels["severity"]): s.value
             for s in families["trainguard_findings"].samples}
    assert found.get(("divergence", "critical")) == 1
    assert all(rule == "divergence" for rule, _ in found)  # the healthy run: no finding
    (jobs,) = families["trainguard_jobs"].samples
    assert (jobs.labels["source"], jobs.labels["environment"], jobs.value) == \
        ("kubeflow", "e2e", 2)
    (last,) = families["trainguard_last_tick_timestamp_seconds"].samples
    assert abs(last.value - time.time()) < 60
