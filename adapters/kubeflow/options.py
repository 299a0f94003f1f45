"""``trainguard check --source kubeflow --opt KEY=VALUE ...``: the adapter from options."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from kubernetes import client
from kubernetes import config as kube_config

from trainguard.adapters.kubeflow.adapter import KubeflowAdapter
from trainguard.adapters.kubeflow.client import Kube, api_client, retry_policy
from trainguard.adapters.kubeflow.kinds import KINDS
from trainguard.adapters.kubeflow.prometheus_hook import PrometheusHook

_config: Any = kube_config  # its loaders carry no type hints
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
N = TypeVar("N", int, float)
PROMETHEUS = ("prometheus_url", "prometheus_token_file", "prometheus_ca_file",
              "prometheus_tenancy", "prometheus_mapping", "prometheus_id")
KNOWN = ("host", "kubeconfig", "context", "in_cluster", "namespaces", "namespace", "cluster",
         "kinds", "delete", "retries", "backoff", "console", *PROMETHEUS)


def from_options(opts: dict[str, str]) -> KubeflowAdapter:
    """Build the Kubeflow adapter. Options (all optional):

    - ``kubeconfig``: path of a kubeconfig (default ``$KUBECONFIG``, else ``~/.kube/config``)
    - ``context``: its context (default: the current one)
    - ``in_cluster``: ``true`` to use the pod's ServiceAccount (the default inside a pod
      when neither ``kubeconfig`` nor ``host`` is given)
    - ``host``: an API server URL used as is, without credentials (``kubectl proxy``,
      the tests' recorded server)
    - ``namespaces`` (or ``namespace``): comma-separated namespaces, or ``*`` for every
      namespace the ServiceAccount can list (default: the context's namespace, in a pod
      the ServiceAccount's own, else ``default``)
    - ``cluster``: the cluster's name in each job's scope ``CLUSTER/NAMESPACE`` (default:
      the context's cluster; ``in-cluster`` in a pod; the host with ``host``)
    - ``kinds``: comma-separated, of ``pytorchjob``, ``trainjob`` (default both)
    - ``delete``: ``true`` to delete a job instead of suspending it (only where the policy
      says so; default ``false``)
    - ``retries``: attempts on throttling (429) and server errors (default 5)
    - ``backoff``: the exponential backoff factor in seconds (default 0.5)
    - ``console``: an OpenShift console URL, for links to each job
    - ``prometheus_url``: read each job's series (loss, step, GPU use) from this
      Prometheus, with ``prometheus_token_file``, ``prometheus_ca_file`` (OpenShift's
      Thanos Querier), ``prometheus_tenancy`` (``true`` when the url is the querier's
      namespaced port, 9092: each query names the job's namespace),
      ``prometheus_mapping`` (a mapping file, see adapters/prometheus)
      and ``prometheus_id`` (the job's id there: ``{name}`` by default, or ``{namespace}``,
      ``{kind}``, ``{id}``)
    """
    unknown = sorted(set(opts) - set(KNOWN))
    if unknown:
        raise ValueError(f"kubeflow: unknown option(s) {unknown} (known: {', '.join(KNOWN)})")
    configuration = client.Configuration()
    namespace = "default"
    if opts.get("host"):
        configuration.host = opts["host"]
        cluster = urlsplit(opts["host"]).netloc or opts["host"]
    elif _flag(opts, "in_cluster", default=_in_pod() and not opts.get("kubeconfig")):
        _config.load_incluster_config(client_configuration=configuration)
        cluster = "in-cluster"
        if SERVICE_ACCOUNT_NAMESPACE.exists():
            namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or namespace
    else:
        path = opts.get("kubeconfig") or os.environ.get("KUBECONFIG") or None
        contexts, current = _config.list_kube_config_contexts(config_file=path)
        chosen = current
        if opts.get("context"):
            chosen = next((c for c in contexts if c.get("name") == opts["context"]), None)
            if chosen is None:
                raise ValueError(f"kubeflow: option context: no context {opts['context']!r} "
                                 f"in {path or '~/.kube/config'}")
        _config.load_kube_config(config_file=path, context=chosen["name"],
                                client_configuration=configuration)
        ctx = chosen.get("context") or {}
        cluster = str(ctx.get("cluster") or chosen["name"])
        namespace = str(ctx.get("namespace") or namespace)
    wanted = opts.get("namespaces") or opts.get("namespace") or namespace
    namespaces = None if wanted.strip() == "*" else _split(wanted, "namespaces")
    retry = retry_policy(_number(opts, "retries", 5, int), _number(opts, "backoff", 0.5, float))
    kinds = _split(opts.get("kinds", ",".join(KINDS)), "kinds")
    return KubeflowAdapter(Kube(api_client(configuration, retry)),
                           cluster=opts.get("cluster") or cluster, namespaces=namespaces,
                           kinds=[k.lower() for k in kinds],
                           delete=_flag(opts, "delete", default=False),
                           console=opts.get("console"), metrics=_prometheus(opts))


def _prometheus(opts: dict[str, str]) -> PrometheusHook | None:
    """The metrics hook the ``prometheus_*`` options describe, reading live."""
    if not opts.get("prometheus_url"):
        return None
    from trainguard.adapters.prometheus import Metrics, client_from_options, load_mapping

    prom = {"url": opts["prometheus_url"], "token_file": opts.get("prometheus_token_file"),
            "ca_file": opts.get("prometheus_ca_file"),
            "tenancy": opts.get("prometheus_tenancy")}
    client = client_from_options({k: v for k, v in prom.items() if v})
    return PrometheusHook(Metrics(client, load_mapping(opts.get("prometheus_mapping"))),
                          opts.get("prometheus_id") or "{name}")


def _in_pod() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _split(value: str, option: str) -> list[str]:
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"kubeflow: option {option}: empty")
    return parts


def _flag(opts: dict[str, str], key: str, default: bool) -> bool:
    value = opts.get(key)
    if value is None or value == "":
        return default
    if value.lower() in ("true", "yes", "1"):
        return True
    if value.lower() in ("false", "no", "0"):
        return False
    raise ValueError(f"kubeflow: option {key}: expected true or false, got {value!r}")


def _number(opts: dict[str, str], key: str, default: N, kind: type[N]) -> N:
    value = opts.get(key)
    if value is None:
        return default
    try:
        number = kind(value)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise ValueError(f"kubeflow: option {key}: expected {expected}, got {value!r}") from None
    if number < 0:
        raise ValueError(f"kubeflow: option {key}: must not be negative, got {value!r}")
    return number
