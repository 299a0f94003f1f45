"""Kubeflow: labels, annotations, env and a PodMonitor for a PyTorchJob or TrainJob.

    from trainguard.launch.kubeflow import watch
    job, monitor = watch(yaml.safe_load(open("pytorchjob.yaml")), policy="research")
    # kubectl apply both: the job, and the PodMonitor that has Prometheus scrape it

The watchdog's CronJob finds jobs by the ``trainguard/watch=true`` label and reads the
policy name from ``trainguard/policy``. In the training containers emit's Prometheus sink
is turned on (``TRAINGUARD_SINKS=prometheus``) and serves ``trainguard_*`` gauges on
``port`` (scraped through the PodMonitor; user workload monitoring on OpenShift), or,
with ``pushgateway="host:9091"``, pushes them there and no PodMonitor is made.
The log lines still go to stdout for Loki or Fluentd.

PyTorchJob (``kubeflow.org/v1``): every replica's pod template gets the labels, the
``prometheus.io/*`` annotations, the env and a container port named ``trainguard``.
TrainJob (``trainer.kubeflow.org/v1alpha1``): ``spec.labels``/``spec.annotations`` (set on
its JobSet and Jobs) and ``spec.trainer.env``; its pods are selected by the JobSet's
``jobset.sigs.k8s.io/jobset-name`` label, and scraped on the port number.
"""

from __future__ import annotations

import copy
from typing import Any

from trainguard.launch import check_policy_name

WATCH_LABEL = "trainguard/watch"
POLICY_LABEL = "trainguard/policy"
PORT_NAME = "trainguard"
DEFAULT_PORT = 9400

Manifest = dict[str, Any]


def _env(job_name: str, port: int | None, pushgateway: str | None) -> list[dict[str, str]]:
    env = [{"name": "TRAINGUARD_SINKS", "value": "prometheus"},
           {"name": "TRAINGUARD_JOB_NAME", "value": job_name}]
    if pushgateway is not None:
        env.append({"name": "TRAINGUARD_PUSHGATEWAY", "value": pushgateway})
    else:
        env.append({"name": "TRAINGUARD_METRICS_PORT", "value": str(port)})
    return env


def _merge_env(existing: list[dict[str, Any]] | None, ours: list[dict[str, str]],
               ) -> list[dict[str, Any]]:
    have = {e.get("name") for e in existing or []}
    return [*(existing or []), *(e for e in ours if e["name"] not in have)]


def _path(doc: Manifest, *keys: str) -> Any:
    node: Any = doc
    for i, key in enumerate(keys):
        if not isinstance(node, dict) or key not in node:
            raise ValueError(f"{doc.get('kind', 'manifest')}: missing {'.'.join(keys[:i + 1])}")
        node = node[key]
    return node


def _pytorchjob(job: Manifest, labels: dict[str, str], env: list[dict[str, str]],
                port: int | None) -> None:
    specs = _path(job, "spec", "pytorchReplicaSpecs")
    for role, spec in specs.items():
        template = spec.setdefault("template", {})
        meta = template.setdefault("metadata", {})
        meta["labels"] = {**meta.get("labels", {}), **labels}
        containers = _path(template, "spec", "containers") if "spec" in template else None
        if not containers:
            raise ValueError(f"PyTorchJob: pytorchReplicaSpecs.{role}.template.spec.containers "
                             "is missing or empty")
        if port is not None:
            meta["annotations"] = {**meta.get("annotations", {}), "prometheus.io/scrape": "true",
                                   "prometheus.io/port": str(port)}
        for c in containers:
            c["env"] = _merge_env(c.get("env"), env)
            if port is not None and not any(p.get("name") == PORT_NAME
                                            for p in c.get("ports", [])):
                c["ports"] = [*c.get("ports", []), {"name": PORT_NAME, "containerPort": port,
                                                    "protocol": "TCP"}]


def _trainjob(job: Manifest, labels: dict[str, str], env: list[dict[str, str]]) -> None:
    spec = _path(job, "spec")
    spec["labels"] = {**spec.get("labels", {}), **labels}
    trainer = spec.setdefault("trainer", {})
    trainer["env"] = _merge_env(trainer.get("env"), env)


def pod_monitor(job: Manifest, port: int = DEFAULT_PORT) -> Manifest:
    """A ``monitoring.coreos.com/v1`` PodMonitor scraping the job's training pods."""
    name = _path(job, "metadata", "name")
    if job["kind"] == "PyTorchJob":
        selector = {"training.kubeflow.org/job-name": name, WATCH_LABEL: "true"}
        endpoint: dict[str, Any] = {"port": PORT_NAME}
    else:  # TrainJob: its pods carry the JobSet's name, not the TrainJob's labels
        selector = {"jobset.sigs.k8s.io/jobset-name": name}
        endpoint = {"targetPort": port}
    meta: dict[str, Any] = {"name": f"{name}-trainguard", "labels": {WATCH_LABEL: "true"}}
    if "namespace" in job["metadata"]:
        meta["namespace"] = job["metadata"]["namespace"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {"selector": {"matchLabels": selector},
                 "podMetricsEndpoints": [{**endpoint, "path": "/metrics", "interval": "30s"}]},
    }


KINDS = {("kubeflow.org/v1", "PyTorchJob"), ("trainer.kubeflow.org/v1alpha1", "TrainJob")}


def watch(manifest: Manifest, policy: str = "default", port: int = DEFAULT_PORT,
          pushgateway: str | None = None) -> tuple[Manifest, Manifest | None]:
    """A watched copy of a PyTorchJob or TrainJob manifest and its PodMonitor (None when
    the metrics are pushed to a Pushgateway instead). The input is not changed."""
    kind = (manifest.get("apiVersion"), manifest.get("kind"))
    if kind not in KINDS:
        raise ValueError(f"expected a PyTorchJob (kubeflow.org/v1) or TrainJob "
                         f"(trainer.kubeflow.org/v1alpha1), got {kind[1]} ({kind[0]})")
    job = copy.deepcopy(manifest)
    meta = _path(job, "metadata")
    name = _path(job, "metadata", "name")
    labels = {WATCH_LABEL: "true", POLICY_LABEL: check_policy_name(policy)}
    meta["labels"] = {**meta.get("labels", {}), **labels}
    env = _env(name, port, pushgateway)
    scrape = None if pushgateway is not None else port
    if kind[1] == "PyTorchJob":
        _pytorchjob(job, labels, env, scrape)
    else:
        _trainjob(job, labels, env)
    return job, (pod_monitor(job, port) if scrape is not None else None)
