"""Failure lines of training jobs from CloudWatch Logs, for the ``logs`` rule.

SageMaker writes each host's output to the log group ``/aws/sagemaker/TrainingJobs``,
stream ``JOBNAME/algo-N-EPOCH``. One FilterLogEvents scan of the group per tick, with a
filter pattern built from the failure signatures' literals, brings only lines that
may be failures across the wire, for every job at once. They are matched against the
full regexes here too, so the buffer kept between ticks (bounded, per job) holds
failures only, and each tick asks only for what came since the last one.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from typing import Any

from botocore.exceptions import ClientError

from trainguard.checker.logship import cloudwatch_pattern
from trainguard.checker.model import LogLine
from trainguard.checker.signatures import match

log = logging.getLogger("trainguard.adapters.sagemaker")

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
OVERLAP_S = 120.0  # lines reach CloudWatch late; re-ask this much, drop what was seen
KEEP_LINES = 200  # per job


def filter_pattern() -> str:
    """The one CloudWatch filter pattern of the failure signatures, as the stacks'
    subscription filter uses it (``checker.logship``)."""
    return cloudwatch_pattern()


def job_of(stream: str) -> str:
    """JOBNAME from JOBNAME/algo-N-EPOCH (a job name cannot hold a slash)."""
    return stream.split("/", 1)[0]


class LogTail:
    """Failure lines per job, fetched incrementally."""

    def __init__(self, logs: Any, lookback_s: float) -> None:
        self.logs = logs
        self.lookback_s = lookback_s
        self.pattern = filter_pattern()
        self.until: float | None = None  # end of the last scan, epoch seconds
        self.lines: dict[str, deque[tuple[str, LogLine]]] = defaultdict(
            lambda: deque(maxlen=KEEP_LINES))

    def refresh(self, now: float) -> None:
        since = now - self.lookback_s if self.until is None else self.until - OVERLAP_S
        pages = self.logs.get_paginator("filter_log_events").paginate(
            logGroupName=LOG_GROUP, filterPattern=self.pattern,
            startTime=int(since * 1000), endTime=int(now * 1000))
        try:
            for page in pages:
                for ev in page.get("events", []):
                    self._add(ev)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
            log.info("log group %s does not exist yet: no job has logged", LOG_GROUP)
        self.until = now
        self._forget(now - self.lookback_s)

    def _add(self, ev: dict[str, Any]) -> None:
        text = str(ev.get("message", "")).rstrip("\n")
        if match(text) is None:  # a literal can be broader than its signature's regex
            return
        buf = self.lines[job_of(str(ev.get("logStreamName", "")))]
        key = str(ev.get("eventId") or (ev.get("logStreamName"), ev.get("timestamp")))
        if any(k == key for k, _ in buf):
            return
        buf.append((key, LogLine(float(ev.get("timestamp", 0)) / 1000.0, text)))

    def _forget(self, before: float) -> None:
        for job in list(self.lines):
            kept = [(k, line) for k, line in self.lines[job] if line.time >= before]
            if kept:
                self.lines[job] = deque(kept, maxlen=KEEP_LINES)
            else:
                del self.lines[job]

    def of(self, job: str) -> list[LogLine]:
        return sorted((line for _, line in self.lines.get(job, ())), key=lambda line: line.time)
