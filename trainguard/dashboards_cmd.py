"""``trainguard dashboards --out DIR``: the dashboards the stacks deploy, as files, for a
team that runs the watchdog without the stacks (or wants to import them by hand)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import yaml

OutOpt = Annotated[Path, typer.Option("--out", help="Folder to write the dashboards into.")]
LABELS = {"app.kubernetes.io/name": "trainguard"}
ACCOUNT = re.compile(r"^\d{12}$")
RESOURCE_ID = re.compile(r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/.+$",
                         re.IGNORECASE)


def _fail(message: str) -> NoReturn:
    typer.echo(f"trainguard: error: {message}", err=True)
    raise typer.Exit(2)


def _labels(options: list[str]) -> dict[str, str]:
    labels = {}
    for option in options:
        key, eq, value = option.partition("=")
        if not eq or not key.strip() or not value.strip():
            _fail(f"--grafana-label {option!r}: expected KEY=VALUE, e.g. dashboards=grafana")
        labels[key.strip()] = value.strip()
    return labels


def _write(path: Path, text: str, written: list[Path]) -> None:
    path.write_text(text, encoding="utf-8")
    written.append(path)


def _yaml(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=False, width=100)


def dashboards(
        out: OutOpt,
        grafana_label: Annotated[list[str] | None, typer.Option(
            "--grafana-label", metavar="KEY=VALUE",
            help="Labels of the grafana-operator's Grafana instances that import the "
                 "dashboard (repeatable); with it, a GrafanaDashboard is written too.")]
        = None,
        namespace: Annotated[str, typer.Option(
            "--namespace", help="Namespace of the GrafanaDashboard.")] = "trainguard",
        aws_account: Annotated[str | None, typer.Option(
            "--aws-account", help="AWS account (12 digits) of the CloudWatch dashboard.")]
        = None,
        aws_region: Annotated[str | None, typer.Option(
            "--aws-region", help="Its region (with --aws-account).")] = None,
        azure_insights_id: Annotated[str | None, typer.Option(
            "--azure-insights-id",
            help="Resource id of the Application Insights component the Function reports "
                 "to; with --azure-ml-workspace-id, the Azure Monitor workbook is written.")]
        = None,
        azure_ml_workspace_id: Annotated[str | None, typer.Option(
            "--azure-ml-workspace-id", help="Resource id of the Azure ML workspace.")]
        = None) -> None:
    """Write the dashboards, generated from the rule registry and the metric names the
    runtimes write: Grafana JSON, the OpenShift console ConfigMap, and (given their
    options) a GrafanaDashboard, the CloudWatch dashboard body and the Azure workbook."""
    try:
        from trainguard.stacks.dashboards import cloudwatch, grafana, kubernetes, workbook
    except ImportError as e:  # grafana-foundation-sdk: an extra, like the stacks' own
        _fail(f"the dashboards need Grafana's grafana-foundation-sdk: {e}")

    labels = _labels(grafana_label or [])
    if (aws_account is None) != (aws_region is None):
        _fail("--aws-account and --aws-region go together")
    if aws_account is not None and not ACCOUNT.match(aws_account):
        _fail(f"--aws-account {aws_account!r}: an AWS account id is 12 digits")
    if (azure_insights_id is None) != (azure_ml_workspace_id is None):
        _fail("--azure-insights-id and --azure-ml-workspace-id go together")
    for name, value in (("--azure-insights-id", azure_insights_id),
                        ("--azure-ml-workspace-id", azure_ml_workspace_id)):
        if value is not None and not RESOURCE_ID.match(value):
            _fail(f"{name} {value!r}: expected a resource id "
                  "(/subscriptions/.../resourceGroups/.../providers/...)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _fail(f"--out {out}: {e.strerror or e}")
    written: list[Path] = []
    _write(out / "grafana-dashboard.json", grafana.dumps(), written)
    _write(out / "openshift-console-dashboard.yaml",
           _yaml(kubernetes.console_configmap(LABELS)), written)
    if labels:
        _write(out / "grafanadashboard.yaml",
               _yaml(kubernetes.grafana_dashboard(namespace, LABELS, labels)), written)
    if aws_account is not None and aws_region is not None:
        body = cloudwatch.dashboard_body(aws_account, aws_region)
        _write(out / "cloudwatch-dashboard.json",
               json.dumps(body, indent=2, sort_keys=True) + "\n", written)
    if azure_insights_id is not None and azure_ml_workspace_id is not None:
        book = workbook.workbook(azure_insights_id, azure_ml_workspace_id)
        _write(out / "workbook.json", json.dumps(book, indent=2, sort_keys=True) + "\n",
               written)
    for path in written:
        typer.echo(f"wrote {path}")
    skipped = []
    if not labels:
        skipped.append("the GrafanaDashboard (give --grafana-label)")
    if aws_account is None:
        skipped.append("the CloudWatch dashboard (give --aws-account and --aws-region)")
    if azure_insights_id is None:
        skipped.append("the Azure workbook (give --azure-insights-id and "
                       "--azure-ml-workspace-id)")
    for what in skipped:
        typer.echo(f"not written: {what}")
