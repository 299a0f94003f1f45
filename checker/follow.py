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

A rule whose verdict is a function of a prefix of a series (a judgement made at block
boundaries) may say so, so that the follower does not even call it in between: each run
it puts ``ctx.state[STABLE] = {name: count, ...}``, meaning "my findings stay the same,
whatever else I read gains records, until one of these series has ``count`` records".
A rule whose verdict can only change on a value out of the ordinary may say so with a
band, ``{name: Band(until, lo, hi)}``: the same findings while the series has fewer than
``until`` records and every record it gained since the rule's run lies within
``[lo, hi]`` (a NaN only with ``nonfinite=True``): a divergence rule is not called while
the loss stays where no blow-up or climb can be. The follower checks each new record once.
A rule may bound the clock too, ``{STABLE_NOW: t}``: the same findings while ``now < t``
(a stall rule whose silence cannot reach its threshold before then; a rule judging
blocks of time, which no record of the next block can change before that block begins:
a cut holds only the records up to its ``now``). The
follower honours it only between consecutive cuts of a replay, while the job's state,
the clock (if read and not bounded), the log lines (if read) are unchanged and no series
the rule found empty has gained a record (a new series may change which one it judges).
Iterating ``job.series`` (its names) is a read of which series exist, not of their
records: a rule that looks up the ones it wants by name is re-run when those grow.

Followers judge cuts of one job (``Job.until``): the records of one run seen up to
different times, so a series' record count says which records a cut holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from trainguard.checker.model import Finding, FloatArray, Job, LogLine, Series
from trainguard.checker.rules.base import Context

if TYPE_CHECKING:
    from trainguard.checker.rules.base import Rule

#: Read marks for what is not a series.
_ALL, _LOGS, _NOW, _JOBS, _NAMES = "\0all", "\0logs", "\0now", "\0jobs", "\0names"
#: The key of ``ctx.state`` where a rule says until when its findings stay the same.
STABLE = "stable"
#: In ``ctx.state[STABLE]``: the clock (``now``) up to which they stay the same.
STABLE_NOW = _NOW


class Band(NamedTuple):
    """In ``ctx.state[STABLE]``: the same findings while the series has fewer than
    ``until`` records and each new one is within ``[lo, hi]`` (or, with ``nonfinite``,
    is NaN or infinite)."""

    until: float
    lo: float
    hi: float
    nonfinite: bool = False


def outside(v: FloatArray, lo: float, hi: float, nonfinite: bool) -> np.ndarray:
    """Per record, whether it leaves the band ``[lo, hi]`` (NaN and inf do not, with
    ``nonfinite``)."""
    out = ~((v >= lo) & (v <= hi))
    if nonfinite:
        out &= np.isfinite(v)
    return out


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
        self._reads.names.add(_NAMES)  # the names; each series looked up is marked itself
        return super().__iter__()

    def __contains__(self, key: object) -> bool:
        self._reads.names.add(_NAMES)
        return super().__contains__(key)

    def items(self) -> Any:
        self._all()
        return super().items()

    def values(self) -> Any:
        self._all()
        return super().values()

    def keys(self) -> Any:
        self._reads.names.add(_NAMES)
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
                            else sorted(names - {_LOGS, _NOW, _JOBS, _NAMES}))
        self.names = frozenset(self.series)
        self.logs, self.now = _LOGS in names, _NOW in names
        self.which = tuple(sorted(job.series)) if _NAMES in names else None

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
            tuple(sorted(series)) if self.which is not None else None,
        )


def _fresh(found: list[Finding]) -> list[Finding]:
    """Copies the caller may change (evaluate sets actions and money on them): shallow,
    with their own evidence (dataclasses.replace costs several times more, at every tick
    a finding stands)."""
    out = []
    for f in found:
        copy = object.__new__(Finding)
        copy.__dict__.update(f.__dict__)
        copy.evidence = dict(f.evidence)
        out.append(copy)
    return out


class Follower:
    """One rule following one job across ticks: ``check`` answers exactly as
    ``rule.check`` would, re-running the rule only when what it read has changed."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.read: _Read | None = None  # what the rule read the last time it ran
        self.key: Key | None = None
        self._key_of: tuple[Job, float] | None = None  # the cut and clock of the last run
        self.found: list[Finding] = []
        self.runs = 0  # times the rule was run (the rest were reused)
        self.calls = 0
        self.seen_at: float | None = None  # the ``now`` of the last cut it was asked about
        self.state: dict[str, Any] = {}  # the rule's own, as ``ctx.state``
        self.stable: dict[str, float | Band] | None = None  # the rule's ``ctx.state[STABLE]``
        # the same, ready to check: series with a count, series with a band, and per banded
        # series the records checked so far
        self.counts: list[tuple[str, float]] = []
        self.bands: list[tuple[str, Band]] = []
        self.banded: dict[str, int] = {}
        self.empty: tuple[str, ...] = ()  # series it read that had no record
        self.clock: float | None = None  # the clock's bound (-inf: read, and not bounded)

    def _still(self, job: Job, changed: Changed) -> bool:
        """The rule's own word that nothing it judges changed (``STABLE``)."""
        read, stable = self.read, self.stable
        if stable is None or read is None or read.never or changed.state \
                or (read.logs and changed.logs):
            return False
        if self.clock is not None and not changed.now < self.clock:
            return False
        series = job.series
        for k, count in self.counts:
            s = series.get(k)
            if s is None or len(s.value) >= count:
                return False
        banded = self.banded
        for k, (until, lo, hi, nonfinite) in self.bands:  # each new record, once
            s = series.get(k)
            if s is None:
                return False
            v = s.value
            n, n0 = len(v), banded[k]
            if n >= until:
                return False
            if n - n0 == 1:
                x = v.item(n0)
                if not (lo <= x <= hi or (nonfinite and not math.isfinite(x))):
                    return False
            elif n > n0 and outside(v[n0:n], lo, hi, nonfinite).any():
                return False
            banded[k] = n
        return not self.empty or not any(k in series and len(series[k]) for k in self.empty)

    def check(self, job: Job, ctx: Context, changed: Changed | None = None) -> list[Finding]:
        self.calls += 1
        last, self.seen_at = self.seen_at, ctx.now
        if self.read is not None:
            if changed is not None and changed.before == last and changed.now == ctx.now:
                # the cut after the one judged last: ``changed`` says all the key would
                if self.read.untouched(changed) or self._still(job, changed):
                    return _fresh(self.found) if self.found else []
            elif self._key() is not None and self.read.key(job, ctx.now) == self._key():
                return _fresh(self.found)
        reads = _Reads()
        seen = object.__new__(type(job))  # a shallow copy (dataclasses.replace costs more)
        seen.__dict__.update(job.__dict__)
        seen.series, seen.logs = _SeenSeries(job.series, reads), _SeenLogs(job.logs, reads)
        found = self.rule.check(seen, _seen_context(ctx, reads, self.state))
        self.runs += 1
        self.stable = self.state.pop(STABLE, None)
        if self.read is None or reads.names != self.read.raw:
            self.read = _Read(reads.names, job)
        if self.stable is not None:
            # (a name the job has not is no series a later cut of it has)
            self.empty = tuple(k for k in self.read.series
                               if k in job.series and not len(job.series[k]))
            self.counts = [(k, c) for k, c in self.stable.items()
                           if k != STABLE_NOW and not isinstance(c, Band)]
            self.bands = [(k, b) for k, b in self.stable.items() if isinstance(b, Band)]
            self.banded = {k: len(job.series[k]) if k in job.series else 0
                           for k, _ in self.bands}
            # a bound on the clock holds whether the rule read the clock or not
            until = self.stable.get(STABLE_NOW, -math.inf if self.read.now else None)
            self.clock = None if until is None else (
                -math.inf if isinstance(until, Band) else float(until))
        self.key, self._key_of = None, (job, ctx.now)  # made when first needed
        self.found = _fresh(found)
        return found

    def _key(self) -> Key | None:
        """What the rule read at its last run, as it stood then (None: never reuse)."""
        if self._key_of is not None and self.read is not None:
            self.key = self.read.key(*self._key_of)
            self._key_of = None
        return self.key


@dataclass
class _Plan:
    """How ``Followers.split`` answers a kind of change: the rules to ask, the followers
    left idle (and of those, the ones with findings), the asked rules' followers, and
    each rule's place in the list."""

    ask: list[Rule]
    idle: list[Follower]
    speaking: list[Follower]
    asked: list[Follower]
    order: dict[int, int]


class Followers:
    """A follower per (job, rule), made on first use: pass one to ``evaluate`` for every
    tick of a replay."""

    def __init__(self) -> None:
        self.by: dict[tuple[str, str], Follower] = {}
        #: set by a replay before each tick: what changed since the tick before
        self.changed: Changed | None = None
        self._configs: tuple[object, list[Rule], tuple[str, ...], dict[str, Any]] | None = None
        # split(): per job and rule list, the tick last split, and for each kind of change
        # the followers it leaves idle; forgotten when a follower's reads or findings turn
        self._seen: dict[tuple[str, int], float] = {}
        self._plans: dict[tuple[Any, ...], _Plan] = {}

    def check(self, rule: Rule, job: Job, ctx: Context) -> list[Finding]:
        key = (job.id, rule.name)
        follower = self.by.get(key)
        if follower is None:
            follower = self.by[key] = Follower(rule)
        read, had = follower.read, bool(follower.found)
        found = follower.check(job, ctx, self.changed)
        if follower.read is not read or bool(follower.found) != had:
            self._plans.clear()
        return found

    def split(self, rules: list[Rule], job: Job, now: float
              ) -> tuple[list[Rule], list[tuple[Rule, list[Finding]]]]:
        """(the rules to ask about ``job`` at this tick, the findings of the others): a
        rule whose follower saw the tick before and read nothing that changed since answers
        as then, without a call per rule (a replay at one tick per record has a million
        ticks at which most rules have nothing new to read). Without ``changed``, all."""
        changed, at = self.changed, (job.id, id(rules))
        last, self._seen[at] = self._seen.get(at), now
        if changed is None or changed.now != now or last != changed.before:
            return rules, []
        sig = (at, changed.series, changed.logs, changed.state)
        plan = self._plans.get(sig)
        if plan is None:
            ask: list[Rule] = []
            idle: list[Follower] = []
            asked: list[Follower] = []
            for rule in rules:
                f = self.by.get((job.id, rule.name))
                if f is None or f.read is None or f.read.never or f.seen_at != last \
                        or not f.read.untouched(changed):
                    ask.append(rule)
                    if f is not None:
                        asked.append(f)
                else:
                    idle.append(f)
            plan = self._plans[sig] = _Plan(ask, idle, [f for f in idle if f.found], asked,
                                            {id(r): i for i, r in enumerate(rules)})
        for f in plan.idle:
            f.calls += 1
            f.seen_at = now
        kept = [(f.rule, _fresh(f.found)) for f in plan.speaking] if plan.speaking else []
        # of the others, those whose rule said until when its findings stand (``STABLE``)
        held = [f for f in plan.asked if f.stable is not None and f.seen_at == last
                and f._still(job, changed)]
        if not held:
            return plan.ask, kept
        speaking = False
        for f in held:
            f.calls += 1
            f.seen_at = now
            if f.found:
                speaking = True
                kept.append((f.rule, _fresh(f.found)))
        if speaking and len(kept) > 1:
            kept.sort(key=lambda rf: plan.order[id(rf[0])])  # in rule order, as evaluate wants
        if len(held) == len(plan.ask):  # every rule asked is held (each has a follower)
            return [], kept
        rules_held = {id(f.rule) for f in held}
        return [r for r in plan.ask if id(r) not in rules_held], kept

    def saw(self, job: Job, rules: list[Rule], now: float) -> None:
        """Note that ``rules`` were asked about ``job`` at ``now`` (``checker.skip``
        answered the ticks up to it for them)."""
        self._seen[(job.id, id(rules))] = now

    def configs(self, policy: Any, rules: list[Rule]) -> dict[str, Any]:
        """Each rule's policy config, read once for the whole replay."""
        c = self._configs
        if c is not None and c[0] is policy and c[1] is rules:
            return c[3]
        names = tuple(r.name for r in rules)
        if c is None or c[0] is not policy or c[2] != names:
            c = (policy, rules, names, {n: policy.rule(n) for n in names})
        self._configs = (policy, rules, c[2], c[3])
        return c[3]

    @property
    def runs(self) -> int:
        return sum(f.runs for f in self.by.values())

    @property
    def calls(self) -> int:
        return sum(f.calls for f in self.by.values())
