"""The normalised model every adapter produces and every rule reads.

Times are seconds as floats. On a job whose ``clock`` is ``wall`` they are Unix
epoch seconds; on ``elapsed`` they are seconds since the job started (a log with
a cumulative time field but no timestamps); on ``step`` there is no time at all
and the step number stands in for it, so rules that need seconds stay silent.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

Clock = Literal["wall", "elapsed", "step"]
FloatArray = npt.NDArray[np.float64]


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


class Action(enum.StrEnum):
    NONE = "none"
    NOTIFY = "notify"
    STOP = "stop"


def _as_array(values: Any) -> FloatArray:
    return np.asarray(values, dtype=np.float64).reshape(-1)


@dataclass
class Series:
    """One metric over time. ``time``, ``step`` and ``value`` have one entry per record.

    ``step`` is NaN where a record carried no step; ``time`` is on the job's clock.
    """

    name: str
    time: FloatArray
    step: FloatArray
    value: FloatArray

    def __post_init__(self) -> None:
        self.time = _as_array(self.time)
        self.step = _as_array(self.step)
        self.value = _as_array(self.value)
        if not (len(self.time) == len(self.step) == len(self.value)):
            raise ValueError(
                f"series {self.name!r}: time, step and value differ in length "
                f"({len(self.time)}, {len(self.step)}, {len(self.value)})"
            )

    def __len__(self) -> int:
        return len(self.value)

    def until(self, t: float) -> Series:
        """The part of the series recorded at or before ``t`` (used by replay)."""
        n = int(np.searchsorted(self.time, t, side="right"))
        return Series(self.name, self.time[:n], self.step[:n], self.value[:n])

    @property
    def last_time(self) -> float | None:
        return float(self.time[-1]) if len(self.time) else None

    def at(self, t: float) -> float | None:
        """The last value recorded at or before ``t`` (None before the first)."""
        i = int(np.searchsorted(self.time, t, side="right")) - 1
        return float(self.value[i]) if i >= 0 else None


@dataclass(frozen=True)
class LogLine:
    time: float
    text: str


@dataclass
class Job:
    """One training job, whatever ran it."""

    id: str
    provider: str = "local"
    scope: str = "local"  # account+region, subscription+workspace, cluster+namespace
    name: str = ""
    state: JobState = JobState.RUNNING
    raw_state: str = ""  # the provider's own words: SecondaryStatus, NotResponding, conditions
    clock: Clock = "wall"
    start_time: float | None = None
    end_time: float | None = None
    instance_type: str | None = None
    instance_count: int = 1
    gpus_per_instance: int | None = None
    hourly_price: float | None = None  # per instance; filled from the price book when None
    restarts: int = 0
    restart_times: list[float] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    console_url: str | None = None
    failure_reason: str | None = None
    max_runtime_s: float | None = None
    planned_steps: int | None = None
    #: Records set aside because a later session of the run logged their steps again (a
    #: restart or a resume from a checkpoint appended to the same file); the series hold
    #: what the later session wrote, as TensorBoard shows them.
    superseded: int = 0
    #: Where a local log shows a new process of the run beginning (its opening written
    #: again) and one saying training finished (``adapters/local/marks.py``): a silence
    #: across either is the job down between two processes, not a hang (``cost.resumes``).
    launches: list[float] = field(default_factory=list)
    finishes: list[float] = field(default_factory=list)
    series: dict[str, Series] = field(default_factory=dict)
    logs: list[LogLine] = field(default_factory=list)
    #: The same metrics per host (SageMaker ``algo-1``, a Kubernetes pod, an Azure ML
    #: node), beside the job's aggregate in ``series``, which stays what rules read by
    #: default. Within a host, ``NAME/gpuN`` is GPU N's own series where the source gives
    #: it (DCGM): ``gpu_util/gpu0``, ``gpu_mem/gpu3``.
    hosts: dict[str, dict[str, Series]] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        return (self.gpus_per_instance or 0) * max(self.instance_count, 1)

    def host_series(self, name: str) -> dict[str, Series]:
        """Host -> that host's series ``name`` (non-empty ones only)."""
        return {h: by[name] for h, by in sorted(self.hosts.items())
                if name in by and len(by[name])}

    def last_time(self) -> float | None:
        """The latest time anything was recorded for this job."""
        times = [s.last_time for s in self.series.values() if len(s)]
        times += [line.time for line in self.logs[-1:]]
        present = [t for t in times if t is not None]
        return max(present) if present else None

    def until(self, t: float) -> Job:
        """This job as it looked at time ``t``: for replaying a finished run tick by tick."""
        import dataclasses

        return dataclasses.replace(
            self,
            state=JobState.RUNNING if self.state.terminal or self.end_time is None
            or self.end_time > t else self.state,
            end_time=self.end_time if self.end_time is not None and self.end_time <= t else None,
            series={k: s.until(t) for k, s in self.series.items()},
            hosts={h: {k: s.until(t) for k, s in by.items()} for h, by in self.hosts.items()},
            logs=[line for line in self.logs if line.time <= t],
            restart_times=[r for r in self.restart_times if r <= t],
            launches=[m for m in self.launches if m <= t],
            finishes=[m for m in self.finishes if m <= t],
            restarts=sum(1 for r in self.restart_times if r <= t)
            if self.restart_times else self.restarts,
        )


@dataclass
class Finding:
    """What a rule concluded about a job. A job's verdict is its findings."""

    job_id: str
    rule: str
    severity: Severity
    message: str
    started_at: float | None = None  # on the job's clock
    step: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    burnt_usd: float | None = None  # spent since the finding's onset
    projected_usd: float | None = None  # the job's spend at its planned end
    action: Action = Action.NOTIFY  # what the policy says to do

    @property
    def key(self) -> str:
        """Identity across ticks: one job, one rule, one kind of trouble."""
        kind = self.evidence.get("kind", "")
        return f"{self.job_id}/{self.rule}/{kind}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "rule": self.rule,
            "severity": self.severity.value,
            "message": self.message,
            "started_at": self.started_at,
            "step": self.step,
            "evidence": self.evidence,
            "burnt_usd": self.burnt_usd,
            "projected_usd": self.projected_usd,
            "action": self.action.value,
        }


def verdict(findings: list[Finding]) -> str:
    """One word for a job: ``ok``, ``info``, ``warning`` or ``critical``."""
    if not findings:
        return "ok"
    return max(findings, key=lambda f: f.severity.rank).severity.value
