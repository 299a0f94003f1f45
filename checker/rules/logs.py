"""``logs``: a known failure signature in the job's log lines (see checker.signatures).

Nothing packaged does this today; operators grep by hand after the money is gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainguard.checker.model import Finding, Job, JobState, LogLine, Severity
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.checker.signatures import BY_NAME, match


@dataclass
class LogsParams:
    ignore: list[str] = param([], "signature names to ignore, e.g. traceback")
    lookback_seconds: float | None = param(
        None, "only lines this recent count; None is every line the job has")
    max_examples: int = param(3, "log lines quoted as evidence")


@register
class Logs(Rule):
    name = "logs"
    Params = LogsParams
    # A failed job's log says why it failed: worth reporting after the fact too.
    states = frozenset({JobState.RUNNING, JobState.FAILED, JobState.UNKNOWN})

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        p: LogsParams = self.params
        since = ctx.now - p.lookback_seconds if p.lookback_seconds is not None else None
        if since is None and ctx.state is not None:
            hits = self._new_lines(job, ctx.state)
        else:
            hits = {}
            self._scan(job.logs, since, hits)
        out = []
        for name, lines in hits.items():
            sig = BY_NAME[name]
            # A signature in a job that already ended is history, not an emergency.
            severity = sig.severity if job.state is JobState.RUNNING else Severity.INFO
            out.append(Finding(
                job_id=job.id, rule=self.name, severity=severity,
                message=f"{sig.meaning} ({len(lines)} line(s) like: {lines[0][1][:120]})",
                started_at=lines[0][0], step=None,
                evidence={"kind": name, "count": len(lines),
                          "examples": [t for _, t in lines[: p.max_examples]]},
            ))
        return out

    def _scan(self, lines: Iterable[LogLine], since: float | None,
              hits: dict[str, list[tuple[float, str]]]) -> None:
        for line in lines:
            if since is not None and line.time < since:
                continue
            sig = match(line.text)
            if sig is not None and sig.name not in self.params.ignore:
                hits.setdefault(sig.name, []).append((line.time, line.text.strip()[:300]))

    def _new_lines(self, job: Job, state: dict[str, Any]) -> dict[str, list[tuple[float, str]]]:
        """Followed tick after tick (``checker.follow``): only the lines new since the last
        run are read, so a long log costs its length once, not at every tick."""
        seen: int = state.get("seen", 0)
        if seen > len(job.logs) or (seen and job.logs[seen - 1] is not state.get("last")):
            seen, state["hits"] = 0, {}  # not the log it read before: read it all again
        hits: dict[str, list[tuple[float, str]]] = state.setdefault("hits", {})
        self._scan(job.logs[seen:], None, hits)
        state["seen"] = len(job.logs)
        state["last"] = job.logs[-1] if job.logs else None
        return hits
