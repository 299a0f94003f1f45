"""The Grafana dashboard as Kubernetes objects: a ConfigMap the OpenShift console shows
under Observe > Dashboards, and a ``GrafanaDashboard`` for the grafana-operator.

* Console: a ConfigMap in ``openshift-config-managed`` labelled
  ``console.openshift.io/dashboard: "true"``, one key holding the dashboard JSON; the
  console runs its queries on the cluster's Thanos querier.
* grafana-operator (``grafana.integreatly.org/v1beta1``): ``spec.json`` holds the
  dashboard, ``spec.instanceSelector`` picks the Grafana instances that import it (the
  only required field of the CRD), ``allowCrossNamespaceImport`` lets a Grafana in
  another namespace take it.
"""

from __future__ import annotations

import json
from typing import Any

from trainguard.stacks.dashboards import grafana

CONSOLE_NAMESPACE = "openshift-config-managed"
CONSOLE_LABEL = "console.openshift.io/dashboard"
OPERATOR_API = "grafana.integreatly.org/v1beta1"
RESYNC = "10m"  # how often the operator checks the dashboard against Grafana
NAME = grafana.UID
KEY = f"{NAME}.json"


def console_data() -> dict[str, str]:
    """The console ConfigMap's ``data``: one key, the dashboard JSON."""
    return {KEY: json.dumps(grafana.dashboard_json(), sort_keys=True)}


def console_configmap(labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": NAME, "namespace": CONSOLE_NAMESPACE,
                         "labels": {**labels, CONSOLE_LABEL: "true"}},
            "data": console_data()}


def operator_spec(instance_labels: dict[str, str]) -> dict[str, Any]:
    """The ``spec`` of a ``GrafanaDashboard`` for the Grafanas labelled ``instance_labels``."""
    return {"instanceSelector": {"matchLabels": dict(instance_labels)},
            "allowCrossNamespaceImport": True, "resyncPeriod": RESYNC,
            "json": json.dumps(grafana.dashboard_json(), sort_keys=True)}


def grafana_dashboard(namespace: str, labels: dict[str, str],
                      instance_labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": OPERATOR_API, "kind": "GrafanaDashboard",
            "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
            "spec": operator_spec(instance_labels)}
