"""The Kubeflow adapter against a recorded Kubernetes API server: what a user sees of
their PyTorchJobs and TrainJobs, how a stop reaches the cluster, and what happens when
the API throttles, fails or forbids."""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.contract.case_kubeflow import NOW, adapter_for, recorded_cluster
from tests.k8s_replay import RECORDINGS, K8sReplay, Reply, status_body
from trainguard.adapters.base import Adapter, AdapterError
from trainguard.adapters.sources import build
from trainguard.checker.evaluate import evaluate
from trainguard.checker.model import Job, JobState, Series
from trainguard.checker.policy import Policy
from trainguard.checker.signatures import match

PTJ = "/apis/kubeflow.org/v1/namespaces/{}/pytorchjobs"
TJ = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{}/trainjobs"
PAGE = {"limit": "500"}
BROKEN = "ml-team/pytorchjob/broken-job"
RUNNING = {"ml-team/pytorchjob/bert-ft", "ml-team/trainjob/llm-sft",
           "research/pytorchjob/vit-sweep"}


@pytest.fixture
def k8s() -> Iterator[K8sReplay]:
    with recorded_cluster() as replay:
        yield replay


def recording(name: str) -> Any:
    return json.loads((RECORDINGS / name).read_text())


def listed(adapter: Adapter) -> dict[str, Job]:
    return {j.id: j for j in adapter.list_jobs(NOW)}


def with_item(body: dict[str, Any], name: str, change: Any) -> dict[str, Any]:
    """A copy of a recorded list with one item changed by ``change(item)``."""
    body = copy.deepcopy(body)
    for item in body["items"]:
        if item["metadata"]["name"] == name:
            change(item)
    return body


# --- what a user sees ----------------------------------------------------------------
def test_pytorchjob_resources_limits_and_scope(k8s: K8sReplay) -> None:
    job = listed(adapter_for(k8s))["ml-team/pytorchjob/bert-ft"]
    assert job.scope == "lab/ml-team" and job.name == "bert-ft"
    assert job.raw_state == "Running/PyTorchJobRunning"
    assert (job.instance_type, job.instance_count, job.gpus_per_instance) == \
        ("p4d.24xlarge", 4, 8)  # Master 1 + Worker 3, 8 GPUs each, from the node selector
    assert job.gpu_count == 32
    assert job.max_runtime_s == 86400  # runPolicy.activeDeadlineSeconds
    assert job.start_time == 1_749_999_482.0  # status.startTime 2025-06-15T14:58:02Z
    assert job.tags["team"] == "nlp"


def test_oomkilled_and_exit_137_pods_give_restart_reasons(k8s: K8sReplay) -> None:
    jobs = listed(adapter_for(k8s))
    bert, vit = jobs["ml-team/pytorchjob/bert-ft"], jobs["research/pytorchjob/vit-sweep"]
    assert bert.restarts == 3  # worker-0 twice (OOMKilled), worker-1 once (NCCL error)
    assert {s.name for line in bert.logs if (s := match(line.text))} >= {"oom_killed"}
    # exit 137 with reason Error: the kernel's OOM killer as the container saw it
    assert [line.text for line in vit.logs if "137" in line.text]
    assert vit.raw_state == "Restarting/PyTorchJobRestarting"
    assert vit.state is JobState.RUNNING


def test_restarts_rule_reads_a_crash_loop_from_the_pods(k8s: K8sReplay) -> None:
    jobs = adapter_for(k8s).list_jobs(NOW)
    findings = {f.job_id: f for f in evaluate(jobs, Policy(), NOW) if f.rule == "restarts"}
    vit = findings["research/pytorchjob/vit-sweep"]
    assert vit.evidence["restarts_without_progress"] == 3
    assert "oom_killed" in vit.evidence["reasons"]


def test_restart_times_only_when_every_restart_has_one(k8s: K8sReplay) -> None:
    single = recording("pods-research-pytorchjobs.json")
    status = single["items"][0]["status"]["containerStatuses"][0]
    status["restartCount"] = 1
    k8s.add_json("GET", "/api/v1/namespaces/research/pods", single,
                 query={"labelSelector": "training.kubeflow.org/job-name", **PAGE})
    vit = listed(adapter_for(k8s))["research/pytorchjob/vit-sweep"]
    assert vit.restarts == 1
    assert vit.restart_times == [1_750_009_205.0]  # lastState.terminated.finishedAt 17:40:05
    bert = listed(adapter_for(k8s))["ml-team/pytorchjob/bert-ft"]
    assert bert.restarts == 3 and bert.restart_times == []  # worker-0's first one is gone


def test_trainjob_nodes_gpus_and_trainer_metrics(k8s: K8sReplay) -> None:
    job = listed(adapter_for(k8s))["ml-team/trainjob/llm-sft"]
    assert job.raw_state == "jobsStatus active=2"
    assert (job.instance_count, job.gpus_per_instance) == (2, 4)  # numNodes, resourcesPerNode
    assert job.instance_type == "g5.12xlarge"  # from its pods' node selector
    assert job.max_runtime_s == 43200
    assert job.start_time == 1_750_005_070.0  # its first pod, not its creation
    updated = 1_750_010_310.0  # trainerStatus.lastUpdatedTime 17:58:30
    assert job.series["loss"].value.tolist() == [1.873]
    assert job.series["loss"].time.tolist() == [updated]
    assert job.series["val_loss"].value.tolist() == [2.014]  # eval_loss, by its usual name
    assert job.series["progress_pct"].value.tolist() == [42.0]


def test_trainjob_of_older_trainer_without_trainer_status(k8s: K8sReplay) -> None:
    def older(item: dict[str, Any]) -> None:
        del item["status"]["trainerStatus"]
        item["status"]["conditions"] = [{
            "type": "Created", "status": "True", "reason": "TrainJobCreated",
            "message": "TrainJob llm-sft is created", "lastTransitionTime": "2025-06-15T16:30:01Z"}]

    k8s.add_json("GET", TJ.format("ml-team"),
                 with_item(recording("trainjobs-ml-team.json"), "llm-sft", older), query=PAGE)
    adapter = adapter_for(k8s)
    job = listed(adapter)["ml-team/trainjob/llm-sft"]
    assert job.state is JobState.RUNNING
    assert job.raw_state == "Created/TrainJobCreated; jobsStatus active=2"
    assert job.series == {}
    assert [e.ref for e in adapter.errors] == [BROKEN]  # the recorded malformed job only


def test_finished_and_suspended_jobs_are_not_listed_but_read(k8s: K8sReplay) -> None:
    def suspended(item: dict[str, Any]) -> None:
        item["spec"]["runPolicy"]["suspend"] = True
        item["status"]["conditions"].append({
            "type": "Suspended", "status": "True", "reason": "PyTorchJobSuspended",
            "message": "PyTorchJob ml-team/bert-ft is suspended.",
            "lastTransitionTime": "2025-06-15T17:59:00Z", "lastUpdateTime": "2025-06-15T17:59:00Z"})

    k8s.add_json("GET", PTJ.format("ml-team"),
                 with_item(recording("pytorchjobs-ml-team.json"), "bert-ft", suspended), query=PAGE)
    adapter = adapter_for(k8s)
    assert "ml-team/pytorchjob/bert-ft" not in listed(adapter)
    done = adapter.get_job("ml-team/pytorchjob/resnet-old", NOW)
    assert done is not None and done.state is JobState.SUCCEEDED
    assert done.end_time == 1_749_906_644.0  # completionTime 2025-06-14T13:10:44Z
    whisper = adapter.get_job("ml-team/trainjob/whisper-done", NOW)
    assert whisper is not None and whisper.state is JobState.SUCCEEDED
    assert whisper.raw_state == "Complete/AllJobsCompleted"


def test_a_suspend_asked_for_but_not_yet_done_is_stopping(k8s: K8sReplay) -> None:
    def asked(item: dict[str, Any]) -> None:
        item["spec"]["suspend"] = True

    body = with_item(recording("trainjobs-ml-team.json"), "llm-sft", asked)
    k8s.add_json("GET", TJ.format("ml-team") + "/llm-sft", body["items"][0])
    job = adapter_for(k8s).get_job("ml-team/trainjob/llm-sft", NOW)
    assert job is not None and job.state is JobState.STOPPING
    assert job.raw_state.endswith("suspend requested")


def test_unknown_condition_keeps_type_and_reason(k8s: K8sReplay) -> None:
    job = adapter_for(k8s).get_job("ml-team/pytorchjob/llama-hib", NOW)
    assert job is not None and job.state is JobState.UNKNOWN
    assert job.raw_state == "Hibernating/CheckpointedToColdStorage"


def test_malformed_job_names_the_field(k8s: K8sReplay, caplog: pytest.LogCaptureFixture) -> None:
    adapter = adapter_for(k8s)
    with caplog.at_level(logging.ERROR):
        jobs = listed(adapter)
    assert set(jobs) == RUNNING
    (error,) = adapter.errors
    assert "PyTorchJob ml-team/broken-job" in error.reason
    assert "spec.pytorchReplicaSpecs.Worker.replicas" in error.reason
    assert "'two'" in error.reason
    assert "broken-job" in caplog.text


def test_a_metric_that_is_not_a_number_is_dropped_the_job_kept(k8s: K8sReplay) -> None:
    def odd(item: dict[str, Any]) -> None:
        item["status"]["trainerStatus"]["metrics"].append({"name": "phase", "value": "warmup"})

    k8s.add_json("GET", TJ.format("ml-team"),
                 with_item(recording("trainjobs-ml-team.json"), "llm-sft", odd), query=PAGE)
    job = listed(adapter_for(k8s))["ml-team/trainjob/llm-sft"]
    assert "phase" not in job.series and "loss" in job.series


# --- metrics hook --------------------------------------------------------------------
def test_metrics_hook_attaches_series(k8s: K8sReplay) -> None:
    seen: list[str] = []

    def prometheus(job: Job) -> dict[str, Series]:
        seen.append(job.id)
        t = NOW - np.arange(5.0)[::-1] * 60.0
        return {"gpu_util": Series("gpu_util", t, np.full(5, np.nan), np.full(5, 93.0))}

    jobs = listed(adapter_for(k8s, metrics=prometheus))
    assert set(seen) == RUNNING  # once per job read
    assert len(jobs["ml-team/pytorchjob/bert-ft"].series["gpu_util"]) == 5
    assert "loss" in jobs["ml-team/trainjob/llm-sft"].series  # the Trainer's own stays


def test_failing_metrics_hook_keeps_the_job_and_reports(k8s: K8sReplay) -> None:
    def broken(job: Job) -> dict[str, Series]:
        raise ConnectionError("prometheus unreachable")

    adapter = adapter_for(k8s, metrics=broken)
    jobs = listed(adapter)
    assert set(jobs) == RUNNING
    reported = {e.ref for e in adapter.errors if "prometheus unreachable" in e.reason}
    assert reported == RUNNING


# --- stopping ------------------------------------------------------------------------
def test_stop_suspends_a_pytorchjob_with_a_merge_patch(k8s: K8sReplay) -> None:
    path = PTJ.format("ml-team") + "/bert-ft"
    k8s.add_json("PATCH", path, recording("pytorchjobs-ml-team.json")["items"][0])
    adapter = adapter_for(k8s)
    adapter.stop(listed(adapter)["ml-team/pytorchjob/bert-ft"], "loss diverged")
    (patch,) = k8s.patches()
    assert (patch.method, patch.path) == ("PATCH", path)
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body["spec"] == {"runPolicy": {"suspend": True}}
    assert patch.body["metadata"]["annotations"]["trainguard.io/stop-reason"] == "loss diverged"


def test_stop_deletes_only_when_told_to(k8s: K8sReplay) -> None:
    path = TJ.format("ml-team") + "/llm-sft"
    k8s.add_json("DELETE", path, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                  "status": "Success", "details": {"name": "llm-sft"}},
                 query={"propagationPolicy": "Background"})  # its pods go with it
    adapter = adapter_for(k8s, delete=True)
    adapter.stop(listed(adapter)["ml-team/trainjob/llm-sft"], "over budget")
    (call,) = k8s.patches()
    assert (call.method, call.path) == ("DELETE", path)
    assert call.query == {"propagationPolicy": "Background"}


# --- faults --------------------------------------------------------------------------
def test_throttling_and_server_errors_are_retried(k8s: K8sReplay) -> None:
    k8s.fail_first("GET", PTJ.format("ml-team"), 429, 503, query=PAGE, retry_after="0")
    k8s.fail_first("GET", "/api/v1/namespaces/ml-team/pods", 500,
                   query={"labelSelector": "training.kubeflow.org/job-name", **PAGE})
    adapter = adapter_for(k8s)
    assert set(listed(adapter)) == RUNNING
    assert k8s.count("GET", PTJ.format("ml-team")) == 3
    assert [e.ref for e in adapter.errors] == [BROKEN]


def test_retries_give_up_and_report_that_namespace(k8s: K8sReplay) -> None:
    k8s.add("GET", PTJ.format("research"), Reply(503, status_body(503, "ServiceUnavailable",
                                                                  "etcd leader changed")),
            query=PAGE)
    adapter = adapter_for(k8s)
    jobs = listed(adapter)
    assert set(jobs) == RUNNING - {"research/pytorchjob/vit-sweep"}
    assert k8s.count("GET", PTJ.format("research")) == 4  # the first try and 3 retries
    failed = [e for e in adapter.errors if e.ref == "lab/research/pytorchjob"]
    assert failed and "503" in failed[0].reason and "etcd leader changed" in failed[0].reason


def test_a_forbidden_namespace_does_not_stop_the_others(k8s: K8sReplay) -> None:
    message = ('pytorchjobs.kubeflow.org is forbidden: User "system:serviceaccount:trainguard:'
               'trainguard" cannot list resource "pytorchjobs" in API group "kubeflow.org" '
               'in the namespace "restricted"')
    k8s.add_json("GET", PTJ.format("restricted"), status_body(
        403, "Forbidden", message, {"group": "kubeflow.org", "kind": "pytorchjobs"}),
        status=403, query=PAGE)
    k8s.add_json("GET", TJ.format("restricted"), recording("trainjobs-research.json"), query=PAGE)
    adapter = adapter_for(k8s, namespaces=["restricted", "ml-team", "research"])
    assert set(listed(adapter)) == RUNNING
    forbidden = [e for e in adapter.errors if e.ref == "lab/restricted/pytorchjob"]
    assert forbidden and forbidden[0].reason.startswith("403 Forbidden: pytorchjobs.kubeflow.org")


def test_nothing_listable_is_a_source_error(k8s: K8sReplay) -> None:
    with pytest.raises(AdapterError, match=r"could not list any job.*404"):
        adapter_for(k8s, namespaces=["nowhere"]).list_jobs(NOW)


def test_pods_that_cannot_be_listed_leave_the_job_and_are_reported(k8s: K8sReplay) -> None:
    k8s.add_json("GET", "/api/v1/namespaces/research/pods",
                 status_body(403, "Forbidden", 'pods is forbidden: cannot list "pods"'),
                 status=403, query={"labelSelector": "training.kubeflow.org/job-name", **PAGE})
    adapter = adapter_for(k8s)
    vit = listed(adapter)["research/pytorchjob/vit-sweep"]
    assert vit.restarts == 0 and vit.instance_type == "g5.2xlarge"
    assert any(e.ref == "lab/research/pods" and e.reason.startswith("pods: 403")
               for e in adapter.errors)


# --- namespaces and pages -------------------------------------------------------------
def test_every_namespace_the_service_account_may_read(k8s: K8sReplay) -> None:
    denied = status_body(403, "Forbidden", "cannot list resource at the cluster scope")
    for cluster_wide in ("/apis/kubeflow.org/v1/pytorchjobs",
                         "/apis/trainer.kubeflow.org/v1alpha1/trainjobs"):
        k8s.add_json("GET", cluster_wide, denied, status=403, query=PAGE)
    k8s.add_json("GET", "/api/v1/namespaces", {
        "kind": "NamespaceList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"},
        "items": [{"metadata": {"name": n}, "spec": {"finalizers": ["kubernetes"]},
                   "status": {"phase": "Active"}} for n in ("kube-system", "ml-team", "research")]})
    for path in (PTJ.format("kube-system"), TJ.format("kube-system")):
        k8s.add_json("GET", path, status_body(403, "Forbidden", "no"), status=403, query=PAGE)
    adapter = adapter_for(k8s)
    adapter.namespaces = None
    assert set(listed(adapter)) == RUNNING
    assert [e.ref for e in adapter.errors] == [BROKEN]


def test_every_page_of_a_long_list_is_read(k8s: K8sReplay) -> None:
    full = recording("pytorchjobs-ml-team.json")
    first, rest = copy.deepcopy(full), copy.deepcopy(full)
    first["items"], rest["items"] = full["items"][:2], full["items"][2:]
    first["metadata"]["continue"] = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NDgzMDB9"
    first["metadata"]["remainingItemCount"] = 2
    k8s.add_json("GET", PTJ.format("ml-team"), first, query=PAGE)
    k8s.add_json("GET", PTJ.format("ml-team"), rest,
                 query={**PAGE, "continue": first["metadata"]["continue"]})
    adapter = adapter_for(k8s)
    assert set(listed(adapter)) == RUNNING
    assert [e.ref for e in adapter.errors] == [BROKEN]


# --- options -------------------------------------------------------------------------
def test_source_registry_builds_it_from_options(k8s: K8sReplay) -> None:
    adapter = build("kubeflow", {"host": k8s.host, "namespaces": "ml-team,research",
                                 "cluster": "lab", "retries": "2", "backoff": "0"})
    assert set(listed(adapter)) == RUNNING


def test_kubeconfig_context_names_the_cluster_and_namespace(k8s: K8sReplay,
                                                            tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "other",
        "clusters": [{"name": "gpu-east", "cluster": {"server": k8s.host}}],
        "users": [{"name": "ci", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "other", "context": {"cluster": "gpu-east", "user": "ci"}},
                     {"name": "research", "context": {"cluster": "gpu-east", "user": "ci",
                                                      "namespace": "research"}}]}))
    adapter = build("kubeflow", {"kubeconfig": str(kubeconfig), "context": "research",
                                 "kinds": "pytorchjob"})
    jobs = listed(adapter)
    assert set(jobs) == {"research/pytorchjob/vit-sweep"}
    assert jobs["research/pytorchjob/vit-sweep"].scope == "gpu-east/research"
    assert k8s.count("GET", TJ.format("research")) == 0  # only the kinds asked for


@pytest.mark.parametrize(("opts", "says"), [
    ({"namespaces": "a", "host": "http://x", "colour": "red"}, "unknown option(s) ['colour']"),
    ({"host": "http://x", "delete": "perhaps"}, "option delete: expected true or false"),
    ({"host": "http://x", "kinds": "mpijob"}, "unknown kind(s) ['mpijob']"),
    ({"host": "http://x", "retries": "many"}, "option retries: expected an integer"),
])
def test_bad_options_say_which_and_why(opts: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=f"^kubeflow: .*{re.escape(says)}"):
        build("kubeflow", opts)


def test_one_tick_costs_calls_per_namespace_not_per_job(k8s: K8sReplay) -> None:
    listed(adapter_for(k8s))
    # 2 namespaces x 2 kinds, and the pods of each kind that has running jobs there
    # (research runs no TrainJob): no per-job GET of an object or of its pods
    assert len(k8s.received) == 4 + 3
    assert k8s.unmatched == []


def test_every_namespace_in_one_call_where_allowed(k8s: K8sReplay) -> None:
    both = recording("pytorchjobs-ml-team.json")
    both["items"] += recording("pytorchjobs-research.json")["items"]
    k8s.add_json("GET", "/apis/kubeflow.org/v1/pytorchjobs", both, query=PAGE)
    k8s.add_json("GET", "/apis/trainer.kubeflow.org/v1alpha1/trainjobs",
                 recording("trainjobs-ml-team.json"), query=PAGE)
    adapter = adapter_for(k8s)
    adapter.namespaces = None
    jobs = listed(adapter)
    assert set(jobs) == RUNNING
    assert jobs["research/pytorchjob/vit-sweep"].scope == "lab/research"
    assert k8s.count("GET", "/api/v1/namespaces") == 0


def test_protect_label_is_the_default_policys_protect_tag(k8s: K8sReplay) -> None:
    """``trainguard:protect`` cannot be a Kubernetes label key; ``trainguard.io/protect``
    (label or annotation) is read as that tag, so the default policy protects the job."""
    body = with_item(recording("pytorchjobs-ml-team.json"), "bert-ft",
                     lambda item: item["metadata"].setdefault("labels", {}).update(
                         {"trainguard.io/protect": "true"}))
    k8s.add_json("GET", PTJ.format("ml-team"), body, query=PAGE)
    job = listed(adapter_for(k8s))["ml-team/pytorchjob/bert-ft"]
    assert job.tags["trainguard:protect"] == "true"
    assert job.tags["trainguard.io/protect"] == "true"
