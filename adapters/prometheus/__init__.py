"""Training jobs' metrics from Prometheus (pushed or scraped training metrics, the DCGM
exporter's GPU metrics), for Kubeflow or any on-prem job.

``from_options`` builds the source for ``trainguard check --source prometheus``;
``series_for`` is the plain function other adapters (Kubeflow) attach metrics with.
See ``mapping.py`` for how a job's series are found.
"""

from __future__ import annotations

import ssl
import time
from pathlib import Path

from trainguard.adapters.prometheus.adapter import REPORTING, SILENT, PrometheusAdapter
from trainguard.adapters.prometheus.client import (
    MAX_POINTS,
    PromClient,
    PrometheusError,
    RawSeries,
    step_for,
)
from trainguard.adapters.prometheus.mapping import Mapping, MappingError, load_mapping
from trainguard.adapters.prometheus.reader import AmbiguousSeries, Metrics, Reading
from trainguard.checker.model import Series

# Options that override one key of the mapping (``--opt discover=...``).
_MAPPING_OPTIONS = ("discover", "id_label", "selector", "state", "state_label",
                    "start_time", "gpus", "history", "recent", "min_step")


def client_from_options(opts: dict[str, str]) -> PromClient:
    """Options: ``url`` (required: the server root, e.g. http://prometheus:9090 or the
    OpenShift Thanos querier https://thanos-querier.openshift-monitoring.svc:9091),
    ``timeout`` (seconds a request may take, default 30), ``retries`` (on 429/5xx and
    connection errors, default 4), ``token_file`` (a bearer token sent with every request,
    e.g. /var/run/secrets/kubernetes.io/serviceaccount/token), ``ca_file`` (CA bundle
    that signs the server's TLS certificate), ``tenancy`` (``true``: the url is a
    namespaced endpoint such as OpenShift's Thanos querier on port 9092, and every query
    names the job's namespace). A token is only sent over https; redirects are never
    followed."""
    url = opts.get("url")
    if not url:
        raise ValueError("source prometheus: option url is required "
                         "(--opt url=http://prometheus:9090)")
    headers = {}
    if opts.get("token_file"):
        try:
            token = Path(opts["token_file"]).read_text().strip()
        except OSError as e:
            raise ValueError(f"source prometheus: option token_file: {e}") from e
        headers["Authorization"] = f"Bearer {token}"
    context = ssl.create_default_context(cafile=opts["ca_file"]) if opts.get("ca_file") else None
    try:
        timeout = float(opts.get("timeout", 30))
        retries = int(opts.get("retries", 4))
    except ValueError as e:
        raise ValueError(f"source prometheus: option timeout or retries: {e}") from e
    tenancy = str(opts.get("tenancy", "false")).lower()
    if tenancy not in ("true", "false"):
        raise ValueError(f"source prometheus: option tenancy: expected true or false, "
                         f"got {opts['tenancy']!r}")
    return PromClient(url, timeout=timeout, retries=retries, headers=headers,
                      ssl_context=context, tenancy=tenancy == "true")


def from_options(opts: dict[str, str]) -> PrometheusAdapter:
    """The Prometheus source. Options: those of ``client_from_options``; ``mapping`` (a
    YAML or JSON file laid out as in ``mapping.py``; default: the trainguard_* metrics
    labelled ``run``); ``scope`` (what the jobs' ``scope`` says, e.g. cluster/namespace;
    default the url); and any one mapping key to override it: ``discover``, ``id_label``,
    ``selector``, ``state``, ``state_label``, ``start_time``, ``gpus``, ``history``,
    ``recent``, ``min_step``; ``namespace`` (read only that namespace's series: jobs
    listed are those the discovery query names there)."""
    known = {"url", "timeout", "retries", "token_file", "ca_file", "tenancy", "mapping",
             "scope", "namespace", *_MAPPING_OPTIONS}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise ValueError(f"source prometheus: unknown option {unknown[0]!r} "
                         f"(known: {', '.join(sorted(known))})")
    overrides = {k: v for k, v in opts.items() if k in _MAPPING_OPTIONS}
    mapping = load_mapping(opts.get("mapping"), overrides)
    return PrometheusAdapter(Metrics(client_from_options(opts), mapping,
                                     namespace=opts.get("namespace") or None),
                             scope=opts.get("scope"))


def series_for(job_id: str, url: str, mapping: Mapping | None = None,
               start: float | None = None, end: float | None = None,
               client: PromClient | None = None) -> dict[str, Series]:
    """A job's series from the Prometheus at ``url``, between ``start`` (default: the
    mapping's ``history`` before ``end``) and ``end`` (default: now)."""
    mapping = mapping or Mapping()
    end = time.time() if end is None else end
    start = end - mapping.history if start is None else start
    return Metrics(client or PromClient(url), mapping).series_for(job_id, start, end)


__all__ = [
    "MAX_POINTS", "REPORTING", "SILENT", "AmbiguousSeries", "Mapping", "MappingError",
    "Metrics", "PromClient", "PrometheusAdapter", "PrometheusError", "RawSeries", "Reading",
    "client_from_options", "from_options", "load_mapping", "series_for", "step_for",
]
