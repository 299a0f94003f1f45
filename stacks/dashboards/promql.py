"""The PromQL of each panel, over the metrics the runtimes really write:

* the Kubernetes CronJob's tick on the Pushgateway (``lambdas/k8s/sinks.py``):
  ``trainguard_findings{rule,severity}``, ``trainguard_jobs_by_verdict{verdict}``,
  ``trainguard_spend_usd_per_hour``, ``trainguard_saved_usd{dry_run}``, each with the
  ``environment`` grouping label;
* the training jobs (``trainguard.emit``'s ``PrometheusSink``): ``trainguard_<metric>``
  labelled ``run`` (``trainguard_throughput``), and ``pod``/``namespace`` where the
  stack's PodMonitor scrapes each pod;
* the NVIDIA DCGM exporter (per GPU, labelled ``pod``, ``namespace``, ``Hostname``):
  ``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_FB_USED`` and ``DCGM_FI_DEV_FB_FREE`` (MiB).

The end-to-end test pushes what those write to a real Pushgateway and runs every query
here against a real Prometheus.
"""

from __future__ import annotations

from trainguard.stacks.dashboards.panels import Panel

#: (expression, legend) pairs per fleet panel key; Grafana fills ``$__interval``
QUERIES: dict[str, list[tuple[str, str]]] = {
    "spend": [("sum by (environment) (trainguard_spend_usd_per_hour)", "{{environment}}")],
    "findings": [("sum by (rule, severity) (trainguard_findings)", "{{rule}} {{severity}}")],
    "verdicts": [("sum by (verdict) (trainguard_jobs_by_verdict)", "{{verdict}}")],
    # a gauge per tick: the largest value in each interval is that interval's stops
    "saved": [("sum by (dry_run) (max_over_time(trainguard_saved_usd[$__interval]))",
               "dry run {{dry_run}}")],
    "throughput": [("sum by (namespace, run) (trainguard_throughput)",
                    "{{namespace}}/{{run}}")],
    # the PodMonitor's scrape labels each series with the pod that exported it
    "throughput_host": [("sum by (namespace, run, pod) (trainguard_throughput)",
                         "{{namespace}}/{{run}} {{pod}}")],
    "gpu_host": [("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "{{Hostname}}")],
    "gpu_util": [("avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL)", "{{namespace}}/{{pod}}")],
    "gpu_mem": [("100 * sum by (namespace, pod) (DCGM_FI_DEV_FB_USED) / (sum by "
                 "(namespace, pod) (DCGM_FI_DEV_FB_USED) + sum by (namespace, pod) "
                 "(DCGM_FI_DEV_FB_FREE))", "{{namespace}}/{{pod}}")],
}


def queries(panel: Panel) -> list[tuple[str, str]]:
    """The panel's (expression, legend) pairs; a rule tile counts that rule's findings."""
    if panel.rule is not None:
        return [(f'sum by (severity) (trainguard_findings{{rule="{panel.rule}"}})',
                 "{{severity}}")]
    return QUERIES[panel.key]
