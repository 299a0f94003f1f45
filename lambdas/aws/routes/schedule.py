"""EventBridge "Scheduled Event": a full tick over SageMaker, state in DynamoDB, findings as
EMF metrics, new critical findings to SNS. The state-change events and log lines that
other invocations left are folded in first, and consumed after the tick used them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from trainguard.adapters.sagemaker import MalformedJob
from trainguard.lambdas.aws.pending import SeededStore, TickSource, seeds
from trainguard.lambdas.aws.routes.base import Route, register
from trainguard.lambdas.aws.runtime import Runtime
from trainguard.lambdas.aws.settings import SERVICE
from trainguard.lambdas.aws.sinks import NAMESPACE, tick_metrics
from trainguard.lambdas.tick import TickReport, tick

# The handler's logger and metric set: powertools shares them by service name, and the
# handler's ``log_metrics`` flushes what is added here.
logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)

SCHEDULED = "Scheduled Event"


@register(detail_type=SCHEDULED)
class Schedule(Route):
    name = "on_schedule"

    def handle(self, rt: Runtime, event: Mapping[str, Any], now: float) -> dict[str, Any]:
        store = rt.store
        for p in store.pending_events():
            try:
                rt.adapter.remember_event(p.event)
            except MalformedJob as e:
                logger.error("dropping a kept state-change event", extra={"reason": str(e)})
                store.consume_event(p)
        events = store.pending_events()
        logs = store.pending_logs()
        source = TickSource(rt.adapter, logs, rt.settings.stop_tag,
                            rt.policy.safety.protect_tag)
        report = tick([source], rt.policy,
                      SeededStore(store, seeds(logs, source.name), source.name),
                      rt.sinks(), now, interval_s=rt.settings.interval_s)
        for p in events:
            store.consume_event(p)
        for q in logs:
            store.consume_logs(q)
        rt.metrics.write(tick_metrics(source.jobs, report.findings, rt.policy,
                                      report.fleet.saved_usd))
        return report_tick(rt, report)


def report_tick(rt: Runtime, report: TickReport) -> dict[str, Any]:
    """Log what the tick found and did, count it in the invocation's metrics, and return
    the summary."""
    for err in rt.adapter.errors:
        logger.warning("job unreadable this tick", extra={"job": err.ref, "reason": err.reason})
    for name, reason in report.source_errors.items():
        logger.error("source failed this tick: no job of it was judged or stopped",
                     extra={"source": name, "reason": reason})
    for reason in report.sink_errors:
        logger.error("alarm sink failed", extra={"reason": reason})
    for ref, reason in report.skipped.items():
        logger.error("malformed job skipped", extra={"job": ref, "reason": reason})
    stops = [a.to_dict() for a in report.stops]
    for a in stops:
        logger.warning("stop" if not a["dry_run"] else "would stop (dry run)", extra=a)
    metrics.add_metric(name="Ticks", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="Stops", unit=MetricUnit.Count,
                       value=sum(1 for a in stops if not a["dry_run"]))
    metrics.add_metric(name="SourceErrors", unit=MetricUnit.Count,
                       value=len(report.source_errors))
    summary = {"route": "schedule", "jobs": report.jobs, "findings": len(report.findings),
               "events": [f"{e.kind} {e.job_key} {e.memory.rule}" for e in report.events],
               "stops": [f"{a['action']} {a['job_id']}" for a in stops],
               "source_errors": report.source_errors, "sink_errors": report.sink_errors,
               "skipped": report.skipped}
    logger.info("tick done", extra=summary)
    return summary
