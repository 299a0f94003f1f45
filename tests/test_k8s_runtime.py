"""The Kubernetes / OpenShift runtime: the CronJob entry point over a recorded Kubernetes
API server (``tests/k8s_replay.py``: no real API server can run here), the ConfigMap
state store (``tests/k8s_configmap.py`` keeps the ConfigMap with the API server's
resourceVersion rules), Alertmanager and the Pushgateway as real servers where a test
needs them, and the Containerfile, checked statically (no container engine runs here).

The shared tick's safety tests (``tests/test_tick.py``) run again below on the ConfigMap
store: they are imported here and take this module's ``store`` fixture.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.k8s_configmap import ConfigMapReplay
from tests.k8s_replay import RECORDINGS, serve
from tests.servers import alertmanager, free_port
from tests.test_tick import (  # noqa: F401  (collected here, on the ConfigMap store)
    test_a_failing_stop_is_retried_then_given_up_with_an_alarm,
    test_an_unconfirmed_stop_is_retried_next_tick,
    test_cap_holds_when_every_job_looks_bad_most_expensive_critical_first,
    test_crash_between_intent_and_done_is_confirmed_not_stopped_twice,
    test_dedup_one_raise_reminders_then_one_resolve,
    test_dry_run_never_stops_but_audits_would_stop_once,
    test_failing_source_is_reported_and_others_proceed,
    test_jobs_already_stopping_are_not_stopped,
    test_persistence_needs_consecutive_ticks,
    test_protect_tag,
    test_real_divergence_rule_stops_a_nan_run,
    test_warning_turning_critical_raises_again_and_persistence_counts_stop_ticks,
)
from trainguard.adapters.kubeflow.client import api_client, retry_policy
from trainguard.adapters.kubeflow.prometheus_hook import PrometheusHook
from trainguard.adapters.prometheus import Metrics, client_from_options
from trainguard.checker.model import Job, JobState, Severity
from trainguard.lambdas.k8s.configmap_state import AUDIT_KEY, ConfigMapStore, data_key
from trainguard.lambdas.k8s.cronjob import (
    BAD_CONFIG,
    ERRORS,
    OK,
    STORE_DOWN,
    ConfigError,
    load_options,
    main,
)
from trainguard.lambdas.k8s.sinks import AlertmanagerSink, alert_labels
from trainguard.lambdas.state import (
    AuditAction,
    AuditRecord,
    FindingMemory,
    JobMemory,
    StateConflict,
    StateStore,
    StateStoreError,
    StopRecord,
)
from trainguard.lambdas.tick import AlarmEvent

ROOT = Path(__file__).resolve().parent.parent
NOW = 1_750_010_400.0  # 2025-06-15T18:00:00Z, just after the recorded jobs started
NS = "ml-team"
PTJ = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
PAGE = {"limit": "500"}


def core_for(replay: ConfigMapReplay) -> client.CoreV1Api:
    cfg = client.Configuration(host=replay.host)
    return client.CoreV1Api(api_client(cfg, retry_policy(attempts=1, backoff=0.0)))


@pytest.fixture
def cm() -> Iterator[ConfigMapReplay]:
    replay = ConfigMapReplay()
    with serve(replay):
        yield replay


@pytest.fixture
def store(cm: ConfigMapReplay) -> StateStore:
    """The ConfigMap store, for the shared tick tests imported above."""
    return ConfigMapStore.from_ref(core_for(cm), cm.ref)


# --- the ConfigMap store -------------------------------------------------------------


def memory(key: str, stop: StopRecord | None = None) -> JobMemory:
    return JobMemory(key, "kubeflow", key.rsplit(":", 1)[-1], 100.0, stop=stop)


def test_one_key_per_job_and_the_objects_labels_kept(cm: ConfigMapReplay) -> None:
    s = ConfigMapStore.from_ref(core_for(cm), cm.ref)
    key = "kubeflow:kubeflow:lab/ml-team:ml-team/pytorchjob/bert-ft"
    s.save([memory(key)])
    (stored,) = cm.data
    assert re.fullmatch(r"[-._a-zA-Z0-9]+", stored) and stored == data_key(key)
    assert stored.startswith("job.kubeflow_kubeflow_lab_ml-team_ml-team_pytorchjob_bert-ft.")
    assert json.loads(cm.data[stored])["job_key"] == key
    assert list(s.load_all()) == [key]
    assert cm.writes == 1  # the replay answers 422 to a write that drops the labels


def test_audit_keeps_the_most_recent_records(cm: ConfigMapReplay) -> None:
    s = ConfigMapStore.from_ref(core_for(cm), cm.ref, audit_keep=3)
    for i in range(5):
        s.append_audit([AuditRecord(float(i), "k", f"j{i}", "kubeflow", "f", "budget",
                                    "critical", AuditAction.WOULD_STOP, "r", True)])
    assert [a.job_id for a in s.audit_log()] == ["j2", "j3", "j4"]
    assert len(cm.data[AUDIT_KEY].splitlines()) == 3


def test_audit_trimming_never_drops_a_stop(cm: ConfigMapReplay) -> None:
    s = ConfigMapStore.from_ref(core_for(cm), cm.ref, audit_keep=3)
    actions = [AuditAction.STOP, AuditAction.SKIP_CAP, AuditAction.STOP_FAILED,
               AuditAction.SKIP_CAP, AuditAction.SKIP_PERSISTENCE, AuditAction.SKIP_CAP]
    for i, action in enumerate(actions):
        s.append_audit([AuditRecord(float(i), "k", f"j{i}", "kubeflow", "f", "budget",
                                    "critical", action, "r", False)])
    assert [a.job_id for a in s.audit_log()] == ["j0", "j2", "j5"]


def test_malformed_memory_names_the_configmap_and_key(cm: ConfigMapReplay) -> None:
    cm.data["job.broken.0123"] = '{"job_key": "x"'
    with pytest.raises(StateStoreError, match=r"ConfigMap trainguard/trainguard-state: "
                                              r"key job\.broken\.0123: .*not JSON"):
        ConfigMapStore.from_ref(core_for(cm), cm.ref).load_all()


def test_data_over_one_mebibyte_is_refused_with_the_way_out(cm: ConfigMapReplay) -> None:
    s = ConfigMapStore.from_ref(core_for(cm), cm.ref)
    big = memory("k")
    big.findings["f"] = FindingMemory("f", "logs", "warning", "x" * 1_100_000, 1.0, 1.0)
    with pytest.raises(StateStoreError, match=r"over the API server.s 1 MiB.*SQLite"):
        s.save([big])
    assert cm.writes == 0


@pytest.mark.parametrize(("method", "status"), [("GET", 500), ("PUT", 403), ("PUT", 500)])
def test_store_errors_name_the_configmap_and_status(cm: ConfigMapReplay, method: str,
                                                    status: int) -> None:
    s = ConfigMapStore.from_ref(core_for(cm), cm.ref)
    if method == "PUT":
        s.load_all()
    cm.faults[method] = [status] * 3  # reads are retried once here, writes never
    with pytest.raises(StateStoreError, match=rf"ConfigMap trainguard/trainguard-state: "
                                              rf"cannot .*{status}"):
        s.save([memory("k")])


def test_a_conflict_elsewhere_is_merged_and_retried(cm: ConfigMapReplay) -> None:
    a = ConfigMapStore.from_ref(core_for(cm), cm.ref)
    b = ConfigMapStore.from_ref(core_for(cm), cm.ref)
    a.load_all()
    b.load_all()
    a.save([memory("job-a")])
    b.save([memory("job-b")])  # 409, re-read, its own key laid over: both kept
    assert cm.conflicts == 1
    assert set(ConfigMapStore.from_ref(core_for(cm), cm.ref).load_all()) == {"job-a", "job-b"}


def test_a_conflicting_memory_fails_the_write(cm: ConfigMapReplay) -> None:
    a = ConfigMapStore.from_ref(core_for(cm), cm.ref)
    b = ConfigMapStore.from_ref(core_for(cm), cm.ref)
    a.load_all()
    b.load_all()
    a.save([memory("j", StopRecord("f", "diverged", intent_at=100.0))])
    with pytest.raises(StateConflict, match="another watchdog changed the memory of j"):
        b.save([memory("j", StopRecord("f", "diverged", intent_at=101.0))])
    assert json.loads(cm.data[data_key("j")])["stop"]["intent_at"] == 100.0


# --- the CronJob over a recorded cluster ---------------------------------------------


def pytorchjob(name: str) -> dict[str, Any]:
    """The recorded bert-ft PyTorchJob (4 x p4d.24xlarge, running for 3 h), renamed."""
    item: dict[str, Any] = copy.deepcopy(json.loads(
        (RECORDINGS / "pytorchjobs-ml-team.json").read_text())["items"][0])
    item["metadata"]["name"] = name
    return item


def fleet(replay: ConfigMapReplay, names: list[str]) -> None:
    jobs = [pytorchjob(n) for n in names]
    replay.add_json("GET", PTJ, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJobList",
                                 "metadata": {}, "items": jobs}, query=PAGE)
    replay.add_json("GET", PODS, json.loads((RECORDINGS / "pods-empty.json").read_text()),
                    query={"labelSelector": "training.kubeflow.org/job-name", **PAGE})
    for item in jobs:
        replay.add_json("PATCH", f"{PTJ}/{item['metadata']['name']}", item)


def suspended(replay: ConfigMapReplay) -> list[str]:
    out = []
    for r in replay.patches():
        assert r.method == "PATCH" and r.body["spec"] == {"runPolicy": {"suspend": True}}
        out.append(r.path.rsplit("/", 1)[-1])
    return out


BUDGET_POLICY = """name: fleet
safety: {dry_run: false, persist_ticks: 1, max_stops_per_tick: %d}
cost: {prices: {p4d.24xlarge: 32.77}}
budget: {per_job_usd: 100}
rules:
  budget: {actions: {critical: stop}}
"""


@pytest.fixture
def env(cm: ConfigMapReplay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The CronJob's environment: every job over its budget, stops enabled, cap 2."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(BUDGET_POLICY % 2)
    values = {"KUBE_HOST": cm.host, "NAMESPACES": NS, "KINDS": "pytorchjob",
              "CLUSTER": "lab", "KUBE_RETRIES": "2", "KUBE_BACKOFF": "0",
              "STATE_CONFIGMAP": cm.ref, "POLICY": str(policy), "STOP_ENABLED": "true"}
    monkeypatch.delenv("TRAINGUARD_CONFIG", raising=False)
    for k, v in values.items():
        monkeypatch.setenv(f"TRAINGUARD_{k}", v)
    return values


def summary(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines and "tick" in lines[-1]
    return dict(lines[-1]["tick"])


def test_every_job_bad_at_once_stops_at_most_the_cap(
        cm: ConfigMapReplay, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    fleet(cm, [f"job-{i}" for i in range(6)])
    assert main(["--now", str(NOW)]) == OK
    assert len(suspended(cm)) == 2
    out = summary(capsys)
    assert out["findings"] == 6 and len(out["stops"]) == 2
    skipped = [json.loads(a)["job_id"] for a in cm.data[AUDIT_KEY].splitlines()
               if json.loads(a)["action"] == "skip_cap"]
    assert len(skipped) == 4
    # The next run stops the next two, never one already stopped.
    assert main(["--now", str(NOW + 300)]) == OK
    assert len(suspended(cm)) == len(set(suspended(cm))) == 4


def test_stop_enabled_false_keeps_an_allowing_policy_in_dry_run(
        cm: ConfigMapReplay, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    fleet(cm, ["job-0"])
    monkeypatch.setenv("TRAINGUARD_STOP_ENABLED", "false")
    assert main(["--now", str(NOW)]) == OK
    assert suspended(cm) == []
    out = summary(capsys)
    assert out["dry_run"] is True and out["stops"] == [f"{NS}/pytorchjob/job-0"]  # would stop


@pytest.mark.parametrize("fault", [[429, 429], [503], [500, 502]])
def test_throttling_and_5xx_from_the_api_server_are_retried(
        cm: ConfigMapReplay, env: dict[str, str], fault: list[int]) -> None:
    fleet(cm, ["job-0"])
    cm.fail_first("GET", PTJ, *fault, query=PAGE, retry_after="0")
    assert main(["--now", str(NOW)]) == OK
    assert cm.count("GET", PTJ) == len(fault) + 1
    assert suspended(cm) == ["job-0"]


def test_an_api_server_that_keeps_failing_is_reported_and_nothing_is_stopped(
        cm: ConfigMapReplay, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    fleet(cm, ["job-0"])
    cm.fail_first("GET", PTJ, *[500] * 10, query=PAGE)
    assert main(["--now", str(NOW)]) == ERRORS
    assert suspended(cm) == []
    assert any("500" in p for p in summary(capsys)["problems"])


@pytest.mark.parametrize(("method", "status"), [("PUT", 403), ("PUT", 500), ("GET", 500)])
def test_configmap_down_is_a_store_error_and_no_suspend(
        cm: ConfigMapReplay, env: dict[str, str], method: str, status: int,
        caplog: pytest.LogCaptureFixture) -> None:
    fleet(cm, ["job-0"])
    cm.faults[method] = [status] * 10
    assert main(["--now", str(NOW)]) == STORE_DOWN
    assert suspended(cm) == []
    assert f"ConfigMap {cm.ref}" in caplog.text and str(status) in caplog.text


def test_a_resource_version_conflict_on_the_stop_intent_stops_once(
        cm: ConfigMapReplay, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Two ticks at once (a manual run beside the CronJob's): the second read the
    ConfigMap before the first wrote its stop intent; its write conflicts, and it stops
    nothing."""
    fleet(cm, ["job-0"])
    codes: list[int] = []
    load_all = ConfigMapStore.load_all
    calls = 0

    def interleaved(self: ConfigMapStore) -> dict[str, JobMemory]:
        nonlocal calls
        calls += 1
        loaded = load_all(self)
        if calls == 1:  # the second tick has read; the first now runs to its end
            codes.append(main(["--now", str(NOW)]))
        return loaded

    monkeypatch.setattr(ConfigMapStore, "load_all", interleaved)
    codes.append(main(["--now", str(NOW + 1)]))
    assert codes == [OK, STORE_DOWN]
    assert suspended(cm) == ["job-0"]
    assert cm.conflicts == 1
    assert "lost the race to an overlapping one" in caplog.text


def test_alertmanager_down_is_a_sink_error_and_the_tick_still_stops(
        cm: ConfigMapReplay, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    fleet(cm, ["job-0"])
    monkeypatch.setenv("TRAINGUARD_ALERTMANAGER_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("TRAINGUARD_ALERTMANAGER_RETRIES", "1")
    assert main(["--now", str(NOW)]) == ERRORS
    assert suspended(cm) == ["job-0"]
    out = summary(capsys)
    assert [p for p in out["problems"] if "cannot reach Alertmanager" in p]
    assert out["stops"] == [f"{NS}/pytorchjob/job-0"]
    # Still down: the alarm is tried again; the stop is remembered, never made twice.
    assert main(["--now", str(NOW + 300)]) == ERRORS
    assert [p for p in summary(capsys)["problems"] if "cannot reach Alertmanager" in p]
    assert suspended(cm) == ["job-0"]
    # Back up: the alarm arrives, and says the job was stopped before.
    with alertmanager("route: {receiver: none}\nreceivers: [{name: none}]\n") as am:
        monkeypatch.setenv("TRAINGUARD_ALERTMANAGER_URL", am.url)
        assert main(["--now", str(time.time())]) == OK
        (alert,) = am_alerts(am.url)
    assert alert["labels"]["job"] == "job-0" and alert["labels"]["rule"] == "budget"
    assert "A stop was already recorded" in alert["annotations"]["description"]
    assert suspended(cm) == ["job-0"]


def test_pushgateway_down_is_reported_after_a_complete_tick(
        cm: ConfigMapReplay, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    fleet(cm, ["job-0"])
    monkeypatch.setenv("TRAINGUARD_PUSHGATEWAY_URL", f"http://127.0.0.1:{free_port()}")
    assert main(["--now", str(NOW)]) == ERRORS
    assert suspended(cm) == ["job-0"]
    assert [p for p in summary(capsys)["problems"] if p.startswith("Pushgateway http://")]


def test_a_full_configmap_raises_an_alarm_naming_the_store_to_use(
        cm: ConfigMapReplay, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Not silent: the tick stops nothing (the store failed), and Alertmanager gets a
    critical state_store_full alert saying which store to use instead."""
    fleet(cm, ["job-0"])
    filler = memory("kubeflow:kubeflow:lab/ml-team:ml-team/pytorchjob/old")
    filler.findings["f"] = FindingMemory("f", "logs", "warning", "x" * 1_000_000, 1.0, 1.0)
    cm.data[data_key(filler.job_key)] = filler.to_json()
    with alertmanager("route: {receiver: none}\nreceivers: [{name: none}]\n") as am:
        monkeypatch.setenv("TRAINGUARD_ALERTMANAGER_URL", am.url)
        assert main(["--now", str(time.time())]) == STORE_DOWN
        (alert,) = am_alerts(am.url)
    assert alert["labels"]["rule"] == "state_store_full"
    assert alert["labels"]["severity"] == "critical"
    assert "TRAINGUARD_STATE_SQLITE" in alert["annotations"]["description"]
    assert suspended(cm) == []


def test_sqlite_on_a_volume_instead_of_the_configmap(
        cm: ConfigMapReplay, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    fleet(cm, ["job-0"])
    monkeypatch.setenv("TRAINGUARD_STATE_SQLITE", str(tmp_path / "state" / "tg.sqlite"))
    assert main(["--now", str(NOW)]) == OK
    assert main(["--now", str(NOW + 300)]) == OK
    assert suspended(cm) == ["job-0"]
    assert cm.writes == 0 and (tmp_path / "state" / "tg.sqlite").is_file()


# --- options -------------------------------------------------------------------------


def test_environment_wins_over_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "trainguard.yaml"
    config.write_text("namespaces: [a, b]\nstop_enabled: true\nremind_every: 600\n")
    opts = load_options({"TRAINGUARD_STOP_ENABLED": "no"}, str(config))
    assert opts.namespaces == "a,b"
    assert opts.stop_enabled is False
    assert opts.remind_every == 600.0


@pytest.mark.parametrize(("text", "env", "message"), [
    ("namespace: a\n", {}, r"trainguard\.yaml: namespace: unknown option"),
    ("remind_every: soon\n", {}, r"trainguard\.yaml: remind_every='soon': expected a number"),
    ("", {"TRAINGUARD_STOP_ENABLED": "maybe"},
     r"TRAINGUARD_STOP_ENABLED='maybe': expected one of true/yes/1/on/false/no/0/off"),
    ("", {"TRAINGUARD_STOP_MODE": "kill"},
     r"TRAINGUARD_STOP_MODE='kill': expected suspend or delete"),
])
def test_bad_options_name_where_they_came_from(tmp_path: Path, text: str, env: dict[str, str],
                                               message: str) -> None:
    config = tmp_path / "trainguard.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_options(env, str(config))


def test_no_state_store_is_a_configuration_error(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("TRAINGUARD_STATE_CONFIGMAP")
    assert main(["--now", str(NOW)]) == BAD_CONFIG
    assert "TRAINGUARD_STATE_CONFIGMAP" in caplog.text


def test_a_mistyped_variable_stops_the_cronjob_before_any_tick(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """``TRAINGUARD_STOP_MODES=delete`` read as nothing would suspend where the operator
    asked for deletes: the CronJob exits with a configuration error naming it."""
    monkeypatch.setenv("TRAINGUARD_STOP_MODES", "delete")
    assert main(["--now", str(NOW)]) == BAD_CONFIG
    assert "TRAINGUARD_STOP_MODES: not a setting the CronJob reads (did you mean " \
           "TRAINGUARD_STOP_MODE?)" in caplog.text


def test_a_bad_policy_is_a_configuration_error_naming_the_file(
        env: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    Path(env["POLICY"]).write_text("safety: {max_stops_per_tick: -1}\n")
    assert main(["--now", str(NOW)]) == BAD_CONFIG
    assert env["POLICY"] in caplog.text


def test_the_prometheus_id_of_a_kubeflow_job() -> None:
    job = Job(id="ml-team/pytorchjob/bert-ft", name="bert-ft")
    hook = PrometheusHook(Metrics(client_from_options({"url": "http://x"})),
                          "{namespace}-{name}", NOW)
    assert hook.prometheus_id(job) == "ml-team-bert-ft"
    hook.id_template = "{name}"
    assert hook.prometheus_id(job) == "bert-ft"


# --- Alertmanager --------------------------------------------------------------------


def event(kind: str, severity: str = "critical", ticks: int = 1, at: float | None = None,
          job: Job | None = None) -> AlarmEvent:
    at = time.time() if at is None else at
    fm = FindingMemory("divergence:loss", "divergence", severity, "loss diverged at step 7",
                       at - 60, at, ticks)
    key = "kubeflow:kubeflow:lab/ml-team:ml-team/pytorchjob/bert-ft"
    return AlarmEvent(kind, None, job, "kubeflow", key, at, at - 60, ticks, fm)  # type: ignore[arg-type]


def test_labels_are_the_same_on_raise_and_on_resolve_without_the_job() -> None:
    running = Job(id="ml-team/pytorchjob/bert-ft", name="bert-ft", scope="lab/ml-team",
                  state=JobState.RUNNING)
    raised = alert_labels(event("raise", job=running))
    assert raised == alert_labels(event("resolve", job=None))
    assert raised == {"alertname": "TrainguardDivergence", "rule": "divergence",
                      "trainguard_rule": "divergence", "severity": "critical",
                      "job": "bert-ft", "job_id": "ml-team/pytorchjob/bert-ft",
                      "source": "kubeflow", "namespace": "ml-team"}


def am_alerts(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=10) as r:
        return list(json.loads(r.read()))


@pytest.fixture
def am() -> Iterator[str]:
    config = "route: {receiver: none}\nreceivers: [{name: none}]\n"
    with alertmanager(config) as server:
        yield server.url


def test_raise_then_resolve_on_a_real_alertmanager(am: str) -> None:
    sink = AlertmanagerSink(am, dry_run=True, expire_after_s=3600)
    now = time.time()
    sink.send(event("raise", at=now))
    (alert,) = am_alerts(am)
    assert alert["status"]["state"] == "active"
    assert alert["labels"]["job"] == "bert-ft"
    assert alert["annotations"]["summary"] == \
        "[trainguard] CRITICAL: divergence on ml-team/pytorchjob/bert-ft"
    ends = alert["endsAt"]
    assert ends.startswith(time.strftime("%Y-%m-%dT%H", time.gmtime(now + 3600)))
    sink.send(event("resolve", at=now + 1))
    assert am_alerts(am) == []


def test_a_finding_that_got_worse_ends_its_lower_severity_alert(am: str) -> None:
    sink = AlertmanagerSink(am, dry_run=True, expire_after_s=3600)
    now = time.time()
    sink.send(event("raise", severity="warning", at=now))
    sink.send(event("raise", severity="critical", ticks=4, at=now + 1))
    assert [a["labels"]["severity"] for a in am_alerts(am)] == ["critical"]
    assert {a["labels"]["severity"] for a in sink.posted} == {s.value for s in Severity}


def test_a_reminder_posts_the_alert_again_with_a_later_end(am: str) -> None:
    sink = AlertmanagerSink(am, dry_run=True, expire_after_s=600)
    now = time.time()
    sink.send(event("raise", at=now))
    first = am_alerts(am)[0]["endsAt"]
    sink.send(event("remind", ticks=20, at=now + 300))
    (alert,) = am_alerts(am)
    assert alert["endsAt"] > first
    assert alert["annotations"]["summary"].startswith("[trainguard] REMINDER critical")


# --- the Containerfile ---------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined."""
    text = (ROOT / "Containerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_containerfile_is_ubi9_python_non_root_and_runs_the_cronjob() -> None:
    steps = instructions()
    froms = [a for i, a in steps if i == "FROM"]
    assert froms and all(re.match(r"registry\.access\.redhat\.com/ubi9/python-311(:|@|\s|$)", a)
                         for a in froms)
    users = [a for i, a in steps if i == "USER"]
    assert users and users[-1].isdigit() and int(users[-1]) != 0  # OpenShift picks the UID
    runs = " ".join(a for i, a in steps if i == "RUN")
    assert "777" not in runs and "chmod -R a+w" not in runs
    assert re.search(r"chgrp -R 0 |chown -R \d+:0 ", runs)  # group 0 owns what is written
    assert re.search(r"chmod -R g[+=]r?w", runs)
    # the kubernetes extra's closure, hash-locked (tests/test_security_supply.py holds the
    # lock to pyproject's dependencies)
    assert "--require-hashes" in runs and "-r requirements.txt" in runs
    (entry,) = [a for i, a in steps if i == "ENTRYPOINT"]
    assert json.loads(entry) == ["python", "-m", "trainguard.lambdas.k8s"]
    module = json.loads(entry)[2]
    import importlib

    assert callable(importlib.import_module(f"{module}.__main__").main)
    copied = [shlex.split(a)[:-1] for i, a in steps if i == "COPY"]
    for sources in copied:
        for src in sources:
            if not src.startswith("--"):
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
