"""Judging one job tick after tick (a replay, a backtest) without judging it afresh each time.

A rule is a pure function of what it reads: the job's series, its log lines, its state,
and the tick's ``now``. A *follower* remembers what its rule read at the last tick it
judged and what it concluded; at the next tick, when none of that has changed (the same
series with the same number of records, the same log lines, the same state, and the same
``now`` if the rule read the clock), the conclusion is the same and the rule is not run.

That is exact for any rule: the follower watches what the rule *did* read, not what it
is assumed to read. It saves the work where it can be saved honestly: a plateau rule
watching ``val_loss`` is not re-run at the 99 ticks between two evaluations, and a
rule that only reads the step clock is not re-run where no step was logged.

A rule whose own input changes at every tick is run at every tick, and if it re-reads
the whole run each time, a replay at one tick per record costs the square of the run's
length. Such a rule makes itself linear with ``ctx.state``: a dict the follower keeps
for it from tick to tick (None when the rule is judged once, as by ``check``), where it
can keep what it worked out from the records it has seen (a running best, completed
blocks' medians) and the number of records that was, and look only at the new ones.
Followers see cuts in time order, but a rule must still check that the cut extends what
it saw (the same series, at least as many records) and start over when it does not.

Followers judge cuts of one job (``Job.until``): the records of one run seen up to
different times, so a series' record count says which records a cut holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainguard.checker.model import Finding, Job, LogLine, Series
from trainguard.checker.rules.base import Context

if TYPE_CHECKING:
    from trainguard.checker.rules.base import Rule

#: Read marks for what is not a series.
_ALL, _LOGS, _NOW, _JOBS = "\0all", "\0logs", "\0now", "\0jobs"


class _Reads:
    def __init__(self) -> None:
        self.names: set[str] = set()


class _SeenSeries(dict[str, Series]):
    """``job.series`` that notes which series a rule looked at (any iteration: all)."""

    def __init__(self, data: dict[str, Series], reads: _Reads) -> None:
        super().__init__(data)
        self._reads = reads

    def __getitem__(self, key: str) -> Series:
        self._reads.names.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self._reads.names.add(key)
        return super().get(key, default)

    def _all(self) -> None:
        self._reads.names.add(_ALL)

    def __iter__(self) -> Iterator[str]:
        self._all()
        return super().__iter__()

    def items(self) -> Any:
        self._all()
        return super().items()

    def values(self) -> Any:
        self._all()
        return super().values()

    def keys(self) -> Any:
        self._all()
        return super().keys()

    def copy(self) -> dict[str, Series]:
        self._all()
        return dict(super().items())

    def __or__(self, other: Any) -> Any:
        self._all()
        return dict(super().items()) | other


class _SeenLogs(list[LogLine]):
    """``job.logs`` that notes being looked at."""

    def __init__(self, data: list[LogLine], reads: _Reads) -> None:
        super().__init__(data)
        self._reads = reads

    def __iter__(self) -> Iterator[LogLine]:
        self._reads.names.add(_LOGS)
        return super().__iter__()

    def __getitem__(self, i: Any) -> Any:
        self._reads.names.add(_LOGS)
        return super().__getitem__(i)

    def __len__(self) -> int:
        self._reads.names.add(_LOGS)
        return super().__len__()

    def __reversed__(self) -> Iterator[LogLine]:
        self._reads.names.add(_LOGS)
        return super().__reversed__()

    def __contains__(self, item: object) -> bool:
        self._reads.names.add(_LOGS)
        return super().__contains__(item)

    def copy(self) -> list[LogLine]:
        self._reads.names.add(_LOGS)
        return list(super().__iter__())


class _SeenContext(Context):
    """The tick's context, noting whether the rule read the clock or looked past its job."""

    def __getattribute__(self, name: str) -> Any:
        if name == "now":
            object.__getattribute__(self, "_reads").names.add(_NOW)
        elif name in ("jobs", "memo"):  # other jobs, or other rules' work: never reused
            object.__getattribute__(self, "_reads").names.add(_JOBS)
        return object.__getattribute__(self, name)


def _seen_context(ctx: Context, reads: _Reads, state: dict[str, Any]) -> Context:
    seen = _SeenContext(now=ctx.now, policy=ctx.policy, jobs=ctx.jobs, memo=ctx.memo,
                        state=state)
    object.__setattr__(seen, "_reads", reads)
    return seen


Key = tuple[Any, ...]


@dataclass(frozen=True)
class Changed:
    """What a caller knows changed in a job between two of its cuts (a replay knows it
    from cutting): the cut at ``before`` to the cut at ``now``. With it a follower whose
    input is untouched answers without comparing what it read."""

    before: float
    now: float
    series: frozenset[str]  # the series that gained records
    logs: bool  # new log lines
    state: bool  # the job's state, end or restarts changed


class _Read:
    """What a rule read at its last run, ready to say whether that changed."""

    def __init__(self, names: set[str], job: Job) -> None:
        self.raw = names
        self.never = _JOBS in names  # other jobs or other rules' work: never reused
        self.all = _ALL in names
        self.series = tuple(sorted(job.series) if self.all
                            else sorted(names - {_LOGS, _NOW, _JOBS}))
        self.names = frozenset(self.series)
        self.logs, self.now = _LOGS in names, _NOW in names

    def untouched(self, changed: Changed) -> bool:
        """True when ``changed`` holds nothing this rule read."""
        return not (self.never or self.now or changed.state
                    or (self.logs and changed.logs)
                    or (changed.series and (self.all or not self.names.isdisjoint(
                        changed.series))))

    def key(self, job: Job, now: float) -> Key | None:
        """What the rule read, as it stands in ``job`` at ``now``; None: never reuse."""
        if self.never:
            return None
        series = job.series
        return (
            job.state, job.end_time, job.restarts, len(job.restart_times),
            tuple([len(series[k]) if k in series else -1 for k in self.series]),
            len(job.logs) if self.logs else None,
            now if self.now else None,
        )


def _fresh(found: list[Finding]) -> list[Finding]:
    """Copies the caller may change (evaluate sets actions and money on them)."""
    return [dataclasses.replace(f, evidence=dict(f.evidence)) for f in found]


class Follower:
    """One rule following one job across ticks: ``check`` answers exactly as
    ``rule.check`` would, re-running the rule only when what it read has changed."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.read: _Read | None = None  # what the rule read the last time it ran
        self.key: Key | None = None
        self.found: list[Finding] = []
        self.runs = 0  # times the rule was run (the rest were reused)
        self.calls = 0
        self.seen_at: float | None = None  # the ``now`` of the last cut it was asked about
        self.state: dict[str, Any] = {}  # the rule's own, as ``ctx.state``

    def check(self, job: Job, ctx: Context, changed: Changed | None = None) -> list[Finding]:
        self.calls += 1
        last, self.seen_at = self.seen_at, ctx.now
        if self.read is not None and self.key is not None:
            if changed is not None and changed.before == last and changed.now == ctx.now \
                    and self.read.untouched(changed):
                return _fresh(self.found) if self.found else []
            if self.read.key(job, ctx.now) == self.key:
                return _fresh(self.found)
        reads = _Reads()
        seen = object.__new__(type(job))  # a shallow copy (dataclasses.replace costs more)
        seen.__dict__.update(job.__dict__)
        seen.series, seen.logs = _SeenSeries(job.series, reads), _SeenLogs(job.logs, reads)
        found = self.rule.check(seen, _seen_context(ctx, reads, self.state))
        self.runs += 1
        if self.read is None or reads.names != self.read.raw:
            self.read = _Read(reads.names, job)
        self.key = self.read.key(job, ctx.now)
        self.found = _fresh(found)
        return found


class Followers:
    """A follower per (job, rule), made on first use: pass one to ``evaluate`` for every
    tick of a replay."""

    def __init__(self) -> None:
        self.by: dict[tuple[str, str], Follower] = {}
        #: set by a replay before each tick: what changed since the tick before
        self.changed: Changed | None = None
        self._configs: tuple[object, tuple[str, ...], dict[str, Any]] | None = None

    def check(self, rule: Rule, job: Job, ctx: Context) -> list[Finding]:
        key = (job.id, rule.name)
        follower = self.by.get(key)
        if follower is None:
            follower = self.by[key] = rule.follow()
        return follower.check(job, ctx, self.changed)

    def configs(self, policy: Any, rules: list[Rule]) -> dict[str, Any]:
        """Each rule's policy config, read once for the whole replay."""
        names = tuple(r.name for r in rules)
        if self._configs is None or self._configs[0] is not policy \
                or self._configs[1] != names:
            self._configs = (policy, names, {n: policy.rule(n) for n in names})
        return self._configs[2]

    @property
    def runs(self) -> int:
        return sum(f.runs for f in self.by.values())

    @property
    def calls(self) -> int:
        return sum(f.calls for f in self.by.values())
