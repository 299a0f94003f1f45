"""The detection benchmark: trainguard's rules and today's tools over labelled runs.

Every run in a labels file (and, on request, six faults injected into each healthy
run with a time axis) is one *case*. On each case trainguard is replayed tick by tick
(``trainguard.replay``) and every anchor (``trainguard.bench.anchors``) is asked where
it would first have fired. Then, per detector and per label: runs flagged, recall,
false alarms, detection delay and what stopping at detection would have saved.

How a detection is timed. The replay ticks every logging interval of the run (no more
often than the live watchdog's ``LIVE_TICK_S`` on a time axis, at most
``trainguard.replay.MAX_AUTO_TICKS`` ticks; ``--tick`` sets the interval) and finds the
first tick at which a finding fires; between that tick and the one before, the rule is
asked again at each record (and, on a time axis, by bisection down to ``resolution_s``
where only time passed, as in a stall), so the delay is the rule's own, at record
resolution like the anchors'. A live watchdog adds up to one of its own ticks to it.
A stalled job is ticked on past its last record for ``STALL_WATCH_S``. Every rule of
the policy is run, so a critical finding of any rule on a healthy case is seen.

Which trainguard finding detects which label (``JUDGES``): ``diverged`` <- a
``divergence`` finding at critical; ``flat`` <- ``plateau`` at warning or above;
``overfit`` <- ``overfit`` at warning or above; ``stalled`` <- ``stall`` at warning or
above; ``slowed`` (injected slowdowns and stragglers) <- ``slowdown`` at warning or
above. The same findings on a healthy or spiky case (a run that recovers and ends
healthy) are false alarms. An anchor competes with the rules of its ``kinds()``; on a
healthy or spiky case anything it does is a false alarm.

Every number is given per label and, with ``by_family``, per family too (the labels
file's ``family`` column): a rule that only works on one family shows it.

A label its author marked ``UNSURE`` (``trainguard.bench.labels``) is a judgement call, not
ground truth to fit: its run is judged like any other and shown apart (``calls``: what
trainguard and every tool of its kind concluded), and left out of every count and the bar.

Savings, at one stated hourly price for every run (default: one Azure
Standard_ND96isr_H100_v5, 8 x H100, from the price book): for a diverged or flat run,
from detection to the run's last record; for a stalled run, from detection to the
job's max runtime, taken as SageMaker's default ``MaxRuntimeInSeconds`` (86,400 s)
counted from the stall's onset. A false alarm on a healthy run throws away what the
run had spent so far (``lost``).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.bench.anchors import ANCHORS, Anchor, KatibMedianStop, RuleKind
from trainguard.bench.inject import INJECTORS, inject
from trainguard.bench.injected import Injected
from trainguard.bench.labels import LABELS, NEGATIVE, Labelled
from trainguard.checker import cost
from trainguard.checker.evaluate import build_rules, evaluate
from trainguard.checker.follow import Followers
from trainguard.checker.metrics import loss_like, primary
from trainguard.checker.model import Clock, Finding, Job, JobState, Series, Severity
from trainguard.checker.policy import Policy
from trainguard.checker.prices import lookup
from trainguard.checker.rules.base import Rule
from trainguard.replay import Cuts, check_ticks, record_times, refine, replay


@dataclass(frozen=True)
class Judge:
    """The trainguard finding that counts as detecting ``label``."""

    rule: RuleKind
    label: str
    min_severity: Severity


JUDGES: dict[RuleKind, Judge] = {
    "divergence": Judge("divergence", "diverged", Severity.CRITICAL),
    "plateau": Judge("plateau", "flat", Severity.WARNING),
    "overfit": Judge("overfit", "overfit", Severity.WARNING),
    "stall": Judge("stall", "stalled", Severity.WARNING),
    # injected only (``bench --inject``): throughput halved for 20 minutes, or a straggler
    "slowdown": Judge("slowdown", "slowed", Severity.WARNING),
}
#: The issue's bar for a slowdown: found within 15 minutes of its onset.
SLOWDOWN_BOUND_S = 900.0
KIND_OF_LABEL: dict[str, RuleKind] = {j.label: kind for kind, j in JUDGES.items()}

#: The family (and group) of every case together.
ALL = "all"
#: SageMaker CreateTrainingJob StoppingCondition.MaxRuntimeInSeconds defaults to one day
#: (86,400 s; API reference, StoppingCondition): a hung job burns until then.
MAX_RUNTIME_S = 86_400.0
#: The instance every run is priced on unless --price says otherwise: the modded-nanogpt
#: runs are 8 x H100 runs, and this is the price book's 8 x H100 instance.
DEFAULT_INSTANCE = "Standard_ND96isr_H100_v5"
#: The issue's bar for a stall: found within 3 x the run's p99 update interval, or 10 min.
STALL_BOUND_FACTOR, STALL_BOUND_MIN_S = 3.0, 600.0
#: How long a stalled job is watched past its last record: as long as the slowest tool
#: here needs (ClearML: 7,200 s, looked at every 900 s), so a stall trainguard finds
#: late still counts as found (and late, against the bound above).
STALL_WATCH_S = 7_200.0 + 2 * 900.0
#: Ticks past a stalled job's last record, up to the watch: the stall is then timed back.
HORIZON_TICKS = 200


@dataclass(frozen=True)
class Pricing:
    usd_per_hour: float  # the whole job
    gpus: int
    instance: str
    source: str  # where the price came from, said in the output


def pricing(usd_per_hour: float | None = None) -> Pricing:
    """The price book's 8 x H100 instance, or ``usd_per_hour`` for the same 8 GPUs."""
    price = lookup(DEFAULT_INSTANCE)
    if price is None:  # pragma: no cover - the book ships with it
        raise RuntimeError(f"{DEFAULT_INSTANCE} is missing from checker/prices.py")
    book = (f"{price.instance_type} ({price.gpus} x {price.gpu_model}, {price.region}) at "
            f"${price.usd_per_hour:g}/h, price book read {price.read_on}: {price.source}")
    if usd_per_hour is not None:
        return Pricing(usd_per_hour, price.gpus, price.instance_type,
                       f"--price ${usd_per_hour:g}/h for a job of {price.gpus} GPUs")
    return Pricing(price.usd_per_hour, price.gpus, price.instance_type, book)


@dataclass(frozen=True)
class Settings:
    tick: float | None = None  # seconds between replay ticks on a time axis; None: auto
    step_tick: float | None = None  # steps between ticks on a run with no time axis
    inject: bool = False
    seed: int = 0
    by_family: bool = False  # every table row per family as well as over all runs
    price: Pricing = field(default_factory=pricing)
    max_runtime_s: float = MAX_RUNTIME_S
    resolution_s: float = 1.0  # how finely a detection between two ticks is timed


class BenchError(Exception):
    """A run that cannot be benchmarked: ``FILE:LINE: run 'x': reason``, naming its labels
    file and line (one plain message, so it crosses process boundaries)."""


@dataclass(frozen=True)
class NotJudged:
    """A labelled run that cannot be read (a bad value, no records): reported with its
    labels line and reason, counted nowhere; the other runs are judged all the same."""

    run: str
    error: str  # ``FILE:LINE: run 'x': reason``


# --- one case ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Detection:
    step: float | None  # the run's last logged step at detection
    time: float | None  # on the run's clock; None when it has no time axis
    severity: str | None  # trainguard's; None for an anchor
    reason: str


@dataclass
class Case:
    run: str  # the labelled run, as in the labels file
    id: str  # the run, or ``run#kind`` for an injected fault
    group: str  # the label, or ``injected:<kind>``
    label: str  # what a detector should conclude
    injected: str | None
    experiment: str  # Katib's "other trials" are the runs of the same experiment
    family: str
    clock: Clock
    metric: str | None  # what the anchors watch
    start_time: float | None
    end_time: float | None  # the last record (the stall's onset on a stalled case)
    end_step: float | None
    onset_step: float | None
    onset_time: float | None
    first_nonfinite_step: float | None = None
    log_interval_steps: float | None = None  # of the loss that first went non-finite
    onset_interval_steps: float | None = None  # of the labelled metric, with a labelled onset
    stall_bound_s: float | None = None
    trainguard: dict[str, dict[str, Detection | None]] = field(default_factory=dict)
    #: every rule of the policy that went critical, judged or not, and when (at its tick)
    critical: dict[str, Detection] = field(default_factory=dict)
    anchors: dict[str, Detection | None] = field(default_factory=dict)
    anchor_errors: dict[str, str] = field(default_factory=dict)
    note: str = ""
    unsure: bool = False  # a judgement call: shown apart, not counted
    katib_series: Series | None = None  # the watched metric, for Katib in the main process

    def detection(self, detector: str) -> Detection | None:
        if detector in self.anchors:
            return self.anchors[detector]
        kind = tg_kind(detector)
        if kind is None:
            raise KeyError(detector)
        level = "critical" if JUDGES[kind].min_severity is Severity.CRITICAL else "warning"
        return self.trainguard.get(kind, {}).get(level)


def tg_name(kind: str) -> str:
    return f"trainguard {kind}"


def tg_kind(detector: str) -> RuleKind | None:
    for kind in JUDGES:
        if detector == tg_name(kind):
            return kind
    return None


def detectors() -> list[tuple[str, RuleKind]]:
    """(name, rule kind) of every detector: trainguard's rule first, then its anchors."""
    out: list[tuple[str, RuleKind]] = []
    for kind in JUDGES:
        out.append((tg_name(kind), kind))
        out += [(name, kind) for name, cls in ANCHORS.items() if kind in cls.kinds()]
    return out


def case_seed(seed: int, run: str, kind: str) -> int:
    """A fixed seed per run and fault: the same numbers whatever the order or --jobs."""
    return zlib.crc32(f"{seed}:{run}:{kind}".encode())


class _Progress:
    """The run's progress: its last logged step at a time, and its update times."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.series = cost.progress(job)

    def step_at(self, t: float) -> float | None:
        return self.series.at(t) if self.series is not None else None

    def time_of_step(self, step: float) -> float | None:
        if self.series is None:
            return None
        at = np.flatnonzero(self.series.step >= step)
        return float(self.series.time[at[0]]) if len(at) else None

    def p99_interval(self) -> float | None:
        """The 99th percentile of the gaps between updates that raised the step."""
        if self.series is None or len(self.series) < 2:
            return None
        gaps = np.diff(cost.update_times(self.series, self.job))
        return float(np.quantile(gaps, 0.99)) if len(gaps) else None


def _interval(s: Series) -> float:
    """A series' logging interval in steps: the median gap between its logged steps."""
    steps = np.unique(s.step[np.isfinite(s.step)])
    return float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0


def _first_nonfinite(job: Job) -> tuple[float | None, float | None]:
    """The first step where a loss is NaN or inf, and that loss's logging interval in steps."""
    first: tuple[float, float] | None = None
    for s in loss_like(job):
        bad = np.flatnonzero(~np.isfinite(s.value) & np.isfinite(s.step))
        if not len(bad):
            continue
        step = float(s.step[bad[0]])
        interval = _interval(s)
        if first is None or step < first[0]:
            first = (step, interval)
    return first if first is not None else (None, None)


class _Judge:
    """Times trainguard's detections on one job: replay, then refine between ticks."""

    def __init__(self, job: Job, policy: Policy, rules: list[Rule], settings: Settings) -> None:
        self.job, self.policy, self.rules, self.settings = job, policy, rules, settings
        self.by_name = {r.name: r for r in rules}
        self.timed = job.clock != "step"
        self.tick = check_ticks(job, settings.tick if self.timed else settings.step_tick)
        self.progress = _Progress(job)
        self.records = record_times(job)
        self.cuts = Cuts(job)
        self.followers = Followers()
        self.critical: dict[str, Detection] = {}  # every rule's first critical tick

    def _refine(self, kind: str, level: Severity, lo: float,
                hi: float) -> tuple[float, Finding | None]:
        """The earliest moment in (lo, hi] at which the finding fires, given it does at
        ``hi`` and did not at ``lo``, the tick before."""
        rule = self.by_name[kind]

        def holds(f: Finding) -> bool:
            return f.rule == kind and f.severity.rank >= level.rank

        return refine(self.cuts, self.policy, rule, holds, lo, hi, self.records,
                      self.settings.resolution_s if self.timed else None)

    def detections(self, horizon: float | None) -> dict[str, dict[str, Detection | None]]:
        """Per judged rule, the first warning-or-worse and the first critical finding;
        ticked on past the last record up to ``horizon`` (a stalled job) when given."""
        result = replay(self.job, self.policy, self.tick, self.rules, self.followers)
        first: dict[tuple[str, Severity], tuple[float, float]] = {}  # (tick, the one before)
        for h in result.histories:
            for fire in (h.first, *h.escalations):
                for level in (Severity.WARNING, Severity.CRITICAL):
                    if fire.severity.rank >= level.rank:
                        key = (h.rule, level)
                        if fire.time < first.get(key, (math.inf, 0.0))[0]:
                            first[key] = (fire.time, result.tick_before(fire.time))
        if horizon is not None and result.ticks:
            # past the last record only time passes: a few hundred ticks find the stall,
            # and refining times it to the resolution
            last = float(result.times[-1]) if result.times is not None else result.end
            step = max(self.tick, (horizon - last) / HORIZON_TICKS)
            k, before = 1, last
            while (t := last + k * step) <= horizon + step \
                    and ("stall", Severity.CRITICAL) not in first:  # nothing more to learn
                for f in evaluate([self.cuts(t)], self.policy, t, rules=self.rules,
                                  followers=self.followers):
                    for level in (Severity.WARNING, Severity.CRITICAL):
                        if f.severity.rank >= level.rank:
                            first.setdefault((f.rule, level), (t, before))
                k, before = k + 1, t
        self.critical = {
            rule: Detection(step=self.progress.step_at(t) if self.timed else t,
                            time=t if self.timed else None, severity="critical",
                            reason=f"{rule} critical at the tick")
            for (rule, level), (t, _) in first.items() if level is Severity.CRITICAL}
        out: dict[str, dict[str, Detection | None]] = {}
        for kind in JUDGES:
            out[kind] = {}
            if kind not in self.by_name:  # not in this policy
                out[kind] = {"warning": None, "critical": None}
                continue
            for level in (Severity.WARNING, Severity.CRITICAL):
                fired = first.get((kind, level))
                if fired is None:
                    out[kind][level.value] = None
                    continue
                t, seen = self._refine(kind, level, fired[1], fired[0])
                out[kind][level.value] = Detection(
                    step=self.progress.step_at(t) if self.timed else t,
                    time=t if self.timed else None,
                    severity=seen.severity.value if seen else level.value,
                    reason=seen.message if seen else "")
        return out


def _anchor_detections(job: Job, metric: str | None) -> tuple[dict[str, Detection | None],
                                                               dict[str, str]]:
    found: dict[str, Detection | None] = {}
    errors: dict[str, str] = {}
    for name, cls in ANCHORS.items():
        if cls is KatibMedianStop:
            continue  # needs the other runs: judged in the main process (``add_katib``)
        try:
            if metric is None:
                raise ValueError(f"job {job.id!r}: no target_metric and no loss to watch")
            fire = cls().first_fire(job, metric)
        except ValueError as e:
            found[name], errors[name] = None, str(e)
            continue
        found[name] = None if fire is None else Detection(fire.step, fire.time, None, fire.reason)
    return found, errors


def _judge_case(job: Job, row: Labelled, policy: Policy, rules: list[Rule],
                settings: Settings, fault: Injected | None) -> Case:
    judge = _Judge(job, policy, rules, settings)
    prog = judge.progress
    metric = row.target_metric
    if metric is None:
        s = primary(job, policy)
        metric = s.name if s is not None else None
    label = fault.label if fault is not None else row.label
    first = prog.series if prog.series is not None and len(prog.series) else None
    start, last = (float(first.time[0]) if first is not None else None), job.last_time()
    # the onset: injected faults know theirs; a labelled onset_step is found on the run;
    # with none, a stalled run stalled at its last record and a bad one was bad from the start
    if fault is not None:
        onset_step, onset_time = fault.onset_step, fault.onset_time
    elif row.onset_step is not None:
        onset_step = row.onset_step
        onset_time = prog.time_of_step(row.onset_step) if judge.timed else None
    elif label == "stalled":
        onset_step, onset_time = prog.step_at(math.inf), last if judge.timed else None
    elif label not in NEGATIVE:
        onset_step = float(first.step[0]) if first is not None else None
        onset_time = start if judge.timed else None
    else:
        onset_step = onset_time = None
    case = Case(
        run=row.run, id=job.id, group=f"injected:{fault.kind}" if fault else row.label,
        label=label, injected=fault.kind if fault else None,
        experiment="|".join(row.group), family=row.family, clock=job.clock, metric=metric,
        start_time=start if judge.timed else None, end_time=last if judge.timed else None,
        end_step=prog.step_at(math.inf), onset_step=onset_step, onset_time=onset_time,
        note=fault.note if fault else "", unsure=row.unsure and fault is None,
    )
    case.first_nonfinite_step, case.log_interval_steps = _first_nonfinite(job)
    if fault is None and row.onset_step is not None and metric in job.series:
        # the label says where the failure begins: the delay is counted from there, in
        # the logging interval of the metric the label is about
        case.onset_interval_steps = _interval(job.series[metric])
    horizon = None
    if label == "stalled" and judge.timed and onset_time is not None:
        p99 = prog.p99_interval()
        case.stall_bound_s = max(STALL_BOUND_FACTOR * (p99 or 0.0), STALL_BOUND_MIN_S)
        horizon = onset_time + max(case.stall_bound_s, STALL_WATCH_S) + 2 * judge.tick
    case.trainguard = judge.detections(horizon)
    case.critical = judge.critical
    case.anchors, case.anchor_errors = _anchor_detections(job, metric)
    if metric is not None and metric in job.series:
        case.katib_series = job.series[metric]
    return case


def load(row: Labelled, sessions: bool = True) -> Job:
    """The labelled run as the bench judges it: finished, unless it is labelled stalled
    (a stalled job is still running when its log stops); ``sessions`` as ``load_run``'s."""
    from trainguard.adapters.local import load_run

    try:
        job = load_run(row.path, definitions=list(row.metrics) or None, fmt=row.format,
                       job_id=row.run, sessions=sessions)
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise BenchError(f"{row.where}: run {row.run!r}: {e}") from None
    if job.last_time() is None:
        raise BenchError(f"{row.where}: run {row.run!r}: no records in it")
    if row.label != "stalled":
        job = dataclasses.replace(job, state=JobState.SUCCEEDED, end_time=job.last_time())
    return job


def faults(job: Job, row: Labelled, settings: Settings) -> list[Injected]:
    """The injected variants of a healthy run with a time axis (none when not asked for);
    a fault the run is too short to carry is left out."""
    if not settings.inject or row.label != "healthy" or job.clock == "step":
        return []
    out = []
    for kind in INJECTORS:
        try:
            out.append(inject(job, kind, case_seed(settings.seed, row.run, kind)))
        except ValueError:
            continue
    return out


def judge_run(row: Labelled, policy: Policy,
              settings: Settings) -> list[Case] | NotJudged:
    """The labelled run and, with ``settings.inject``, its injected faults: one Case each;
    a run that cannot be read, ``NotJudged``.

    Runs in a worker process; any other failure comes back as a ``BenchError``."""
    try:
        job = load(row)
    except BenchError as e:
        return NotJudged(row.run, str(e))
    rules = build_rules(policy)  # all of them: a critical finding of any rule is an alarm
    try:
        cases = [_judge_case(job, row, policy, rules, settings, None)]
        for fault in faults(job, row, settings):
            cases.append(_judge_case(fault.job, row, policy, rules, settings, fault))
    except ValueError as e:  # too many ticks: a unit mistake
        raise BenchError(f"{row.where}: run {row.run!r}: {e}") from None
    return cases


def add_katib(cases: list[Case]) -> None:
    """Katib's median stopping rule, across the other runs of each experiment.

    The peers are the labelled runs themselves (not injected variants), each a completed
    trial; a case's own source run is never its peer."""
    peers: dict[str, list[Job]] = {}
    for c in cases:
        if c.injected is None and c.katib_series is not None and c.metric is not None:
            stub = Job(id=c.run, state=JobState.SUCCEEDED, clock=c.clock,
                       series={c.metric: c.katib_series})
            peers.setdefault(c.experiment, []).append(stub)
    anchor: Anchor = KatibMedianStop()
    for c in cases:
        if c.katib_series is None or c.metric is None:
            c.anchors[anchor.name] = None
            c.anchor_errors[anchor.name] = f"no series {c.metric!r} to watch"
            continue
        job = Job(id=c.id, state=JobState.SUCCEEDED, clock=c.clock,
                  series={c.metric: c.katib_series})
        others = [p for p in peers.get(c.experiment, []) if p.id != c.run]
        fire = anchor.first_fire(job, c.metric, others)
        c.anchors[anchor.name] = (None if fire is None
                                  else Detection(fire.step, fire.time, None, fire.reason))
        c.katib_series = None  # done with it: keep the results small


def _size(path: Path) -> int:
    """Bytes in a run's file, or in its folder's files."""
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def check_run_ticks(row: Labelled, settings: Settings) -> None:
    """A given tick that would make too many ticks on this run: a ``BenchError`` (a run
    that cannot be read is ``judge_run``'s to report)."""
    try:
        job = load(row)
    except BenchError:
        return
    try:
        check_ticks(job, settings.tick if job.clock != "step" else settings.step_tick)
    except ValueError as e:
        raise BenchError(f"{row.where}: run {row.run!r}: {e}") from None


def judge_all(rows: list[Labelled], policy: Policy, settings: Settings, jobs: int = 1,
              advance: Callable[[], None] | None = None
              ) -> tuple[list[Case], list[NotJudged]]:
    """Every case of every row, in the labels file's order whatever ``jobs`` is, and the
    runs that could not be read. With a given tick, every run's tick count is checked
    first, before any is judged."""
    done: list[list[Case] | NotJudged] = [[] for _ in rows]
    if settings.tick is not None or settings.step_tick is not None:
        if jobs <= 1:
            for row in rows:
                check_run_ticks(row, settings)
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                list(pool.map(check_run_ticks, rows, [settings] * len(rows)))
    if jobs <= 1:
        for i, row in enumerate(rows):
            done[i] = judge_run(row, policy, settings)
            if advance:
                advance()
    else:
        # the largest runs first, so the longest replay does not start last
        order = sorted(range(len(rows)), key=lambda i: -_size(rows[i].path))
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(judge_run, rows[i], policy, settings): i for i in order}
            for fut in as_completed(futures):
                done[futures[fut]] = fut.result()
                if advance:
                    advance()
    cases = [c for batch in done if not isinstance(batch, NotJudged) for c in batch]
    add_katib(cases)
    return cases, [batch for batch in done if isinstance(batch, NotJudged)]


# --- the numbers ------------------------------------------------------------------------------


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def _max(xs: list[float]) -> float | None:
    return max(xs) if xs else None


@dataclass
class Outcome:
    """One detector on one case: what it cost or saved."""

    flagged: bool
    delay_steps: float | None = None
    delay_min: float | None = None
    saved_hours: float | None = None
    lost_hours: float | None = None  # a false stop: the run's spend so far, thrown away


def outcome(case: Case, det: Detection | None, settings: Settings) -> Outcome:
    if det is None:
        return Outcome(False)
    out = Outcome(True)
    if case.label in NEGATIVE:  # nothing to be late for: what a false stop throws away
        if det.time is not None and case.start_time is not None:
            out.lost_hours = max(det.time - case.start_time, 0.0) / 3600
        return out
    if case.onset_step is not None and det.step is not None:
        out.delay_steps = det.step - case.onset_step
    if case.onset_time is not None and det.time is not None:
        out.delay_min = (det.time - case.onset_time) / 60.0
    if det.time is None:
        return out
    if case.label == "stalled" and case.onset_time is not None:
        out.saved_hours = max(case.onset_time + settings.max_runtime_s - det.time, 0.0) / 3600
    elif case.end_time is not None:
        out.saved_hours = max(case.end_time - det.time, 0.0) / 3600
    return out


@dataclass
class Row:
    """One detector on the cases of one group (a label, or one injected fault), or on all
    the cases its rule kind is judged on (``group`` ``all``)."""

    detector: str
    kind: RuleKind
    group: str
    label: str
    runs: int
    flagged: int
    family: str  # ``all``, or the family these cases belong to
    warned: int | None  # trainguard: cases with a finding of this rule at warning or above
    critical: int | None  # trainguard: cases where it went critical
    delay_steps_median: float | None
    delay_steps_max: float | None
    delay_min_median: float | None
    delay_min_max: float | None
    saved_gpu_hours: float | None
    saved_usd: float | None
    lost_usd: float | None

    @property
    def rate(self) -> float | None:
        return self.flagged / self.runs if self.runs else None


def _row(detector: str, kind: RuleKind, group: str, label: str, cases: list[Case],
         settings: Settings, family: str = ALL) -> Row:
    outs = [outcome(c, c.detection(detector), settings) for c in cases]
    hit = [o for o in outs if o.flagged]
    saved = [o.saved_hours for o in hit if o.saved_hours is not None]
    lost = [o.lost_hours for o in hit if o.lost_hours is not None]
    p = settings.price
    warned = critical = None
    if tg_kind(detector) is not None:
        levels = [c.trainguard.get(kind, {}) for c in cases]
        warned = sum(1 for lv in levels if lv.get("warning") is not None)
        critical = sum(1 for lv in levels if lv.get("critical") is not None)
    steps = [o.delay_steps for o in hit if o.delay_steps is not None]
    mins = [o.delay_min for o in hit if o.delay_min is not None]
    return Row(
        detector=detector, kind=kind, group=group, label=label, runs=len(cases),
        flagged=len(hit), family=family, warned=warned, critical=critical,
        delay_steps_median=_median(steps), delay_steps_max=_max(steps),
        delay_min_median=_median(mins), delay_min_max=_max(mins),
        saved_gpu_hours=sum(saved) * p.gpus if saved else None,
        saved_usd=sum(saved) * p.usd_per_hour if saved else None,
        lost_usd=sum(lost) * p.usd_per_hour if lost else None,
    )


def groups(cases: Iterable[Case]) -> list[tuple[str, str]]:
    """(group, label) in a stable order: real labels first, then injected faults."""
    seen = {(c.group, c.label) for c in cases}
    order = [*LABELS, *(f"injected:{k}" for k in INJECTORS)]
    return sorted(seen, key=lambda g: (order.index(g[0]) if g[0] in order else 99, g[0]))


def families(cases: Iterable[Case]) -> list[str]:
    return sorted({c.family for c in cases})


def by_family(cases: list[Case], settings: Settings) -> list[tuple[str, list[Case]]]:
    """(``all``, every case), then, with ``settings.by_family``, each family's cases."""
    out = [(ALL, cases)]
    if settings.by_family:
        out += [(f, [c for c in cases if c.family == f]) for f in families(cases)]
    return out


def detail_rows(cases: list[Case], settings: Settings) -> list[Row]:
    """Every detector on every group, over all cases and (by family) per family."""
    out = []
    for family, members in by_family(cases, settings):
        for name, kind in detectors():
            for group, label in groups(members):
                grouped = [c for c in members if c.group == group]
                out.append(_row(name, kind, group, label, grouped, settings, family))
    return out


@dataclass
class HeadToHead:
    """One detector against its rule kind's bad cases (recall) and every healthy or spiky
    case (false alarms), over all runs or one family's."""

    detector: str
    kind: RuleKind
    bad: Row  # on every case labelled as this kind's failure
    healthy: Row  # on every healthy or spiky case: flagged are false alarms
    verdict: str  # against trainguard's rule of the same kind ("" on trainguard's own row)
    family: str = "all"


def _fraction(n: int, d: int) -> float:
    return n / d if d else 0.0


def verdict(tg: HeadToHead, other: HeadToHead) -> str:
    """How trainguard's row compares with an anchor's (the issue's bar: fewer false
    alarms at equal or better recall); on a tie, which detects sooner."""
    r_tg = _fraction(tg.bad.flagged, tg.bad.runs)
    r_a = _fraction(other.bad.flagged, other.bad.runs)
    fa_tg, fa_a = tg.healthy.flagged, other.healthy.flagged
    if r_tg >= r_a and fa_tg < fa_a:
        return "trainguard better: fewer false alarms" + (", higher recall" if r_tg > r_a
                                                          else ", same recall")
    if r_tg > r_a and fa_tg == fa_a:
        return "trainguard better: higher recall, same false alarms"
    if r_tg == r_a and fa_tg == fa_a:
        return "tie" + _sooner(tg.bad, other.bad)
    if r_tg <= r_a and fa_tg >= fa_a:
        return "anchor better: " + ("higher recall" if r_a > r_tg else "fewer false alarms")
    return "mixed: " + ("trainguard fewer false alarms, lower recall" if fa_tg < fa_a
                        else "trainguard higher recall, more false alarms")


def _sooner(tg: Row, other: Row) -> str:
    for unit, a, b in (("min", tg.delay_min_median, other.delay_min_median),
                       ("steps", tg.delay_steps_median, other.delay_steps_median)):
        if a is not None and b is not None and a != b:
            who = "trainguard" if a < b else "anchor"
            return f"; {who} sooner (median delay {a:.4g} vs {b:.4g} {unit})"
    return ""


def head_to_head(cases: list[Case], settings: Settings) -> list[HeadToHead]:
    """Each detector against trainguard's rule of its kind, over all runs and (by family)
    in each family; a kind with no bad case in a family has no rows there."""
    out: list[HeadToHead] = []
    for family, members in by_family(cases, settings):
        healthy = [c for c in members if c.label in NEGATIVE]
        here: list[HeadToHead] = []
        for name, kind in detectors():
            label = JUDGES[kind].label
            bad = [c for c in members if c.label == label]
            if family != ALL and not bad:
                continue
            here.append(HeadToHead(
                name, kind, _row(name, kind, ALL, label, bad, settings, family),
                _row(name, kind, ALL, " or ".join(NEGATIVE), healthy, settings, family), "",
                family))
        for h in here:
            if tg_kind(h.detector) is None:
                tg = next(x for x in here if x.detector == tg_name(h.kind))
                h.verdict = verdict(tg, h)
        out += here
    return out


@dataclass(frozen=True)
class Check:
    """One line of the issue's bar: what was measured and whether it passed."""

    what: str
    result: str
    passed: bool | None  # None: a tie, neither better nor worse
    detail: list[str] = field(default_factory=list)  # the runs that broke it


def _ids(cases: Iterable[Case]) -> list[str]:
    return [c.id for c in cases]


def _divergence_onset(c: Case) -> tuple[float | None, float]:
    """Where a diverged case's divergence begins, in steps, and the logging interval a
    detection may lag it by: the labelled onset in its metric's interval, else the first
    non-finite value in its loss's interval."""
    if c.injected is None and c.onset_step is not None and c.onset_interval_steps is not None:
        return c.onset_step, c.onset_interval_steps
    return c.first_nonfinite_step, c.log_interval_steps or 0.0


def bar_checks(cases: list[Case], heads: list[HeadToHead]) -> list[Check]:
    """The issue's bar, where the cases allow judging it."""
    out: list[Check] = []

    def tg(c: Case, kind: str, level: str) -> Detection | None:
        return c.trainguard.get(kind, {}).get(level)

    diverged = [c for c in cases if c.label == "diverged"]
    if diverged:
        # A run whose only non-finite value is its last record gives no later record to
        # confirm it by: counted apart, so the bar is judged where it can be.
        ends = [c for c in diverged if c.first_nonfinite_step is not None
                and c.end_step is not None and c.first_nonfinite_step >= c.end_step]
        judged = [c for c in diverged if c not in ends]
        aside = ""
        if ends:
            warned = sum(1 for c in ends if tg(c, "divergence", "warning") is not None)
            critical = sum(1 for c in ends if tg(c, "divergence", "critical") is not None)
            aside = (f" judgeable; {len(ends)} more end at their first non-finite value "
                     f"(critical on {critical}, warning or above on {warned})")
        missed = [c for c in judged if tg(c, "divergence", "critical") is None]
        unconfirmed = [c for c in ends if tg(c, "divergence", "critical") is None]
        out.append(Check("every diverged run flagged critical",
                         f"{len(judged) - len(missed)}/{len(judged)}{aside}",
                         not missed and not unconfirmed, _ids(missed + unconfirmed)))
        late = []
        for c in judged:
            d = tg(c, "divergence", "critical")
            onset, interval = _divergence_onset(c)
            if d is None or d.step is None or onset is None or d.step - onset > interval + 1e-9:
                late.append(c)
        out.append(Check("... within one logging interval of its onset (labelled, else the "
                         "first non-finite value)",
                         f"{len(judged) - len(late)}/{len(judged)}{aside}",
                         not late and not unconfirmed, _ids(late + unconfirmed)))
    negatives = [c for c in cases if c.group in NEGATIVE]
    if negatives:
        bad = [c for c in negatives if c.critical]
        out.append(Check("no critical finding of any rule on a healthy or spiky run",
                         f"{len(bad)}/{len(negatives)} fired", not bad, _ids(bad)))
    for group, what in (("healthy", "no critical divergence on a healthy run"),
                        ("spiky", "no critical divergence on a spiky run that recovers"),
                        ("injected:spike", "no critical divergence on a spike that recovers"),
                        ("injected:nanblip",
                         "no critical divergence on a lone non-finite value that recovers")):
        members = [c for c in cases if c.group == group]
        if members:
            bad = [c for c in members if tg(c, "divergence", "critical") is not None]
            out.append(Check(what, f"{len(bad)}/{len(members)} fired", not bad, _ids(bad)))
    flat = [c for c in cases if c.label == "flat"]
    if flat:
        missed = [c for c in flat if tg(c, "plateau", "warning") is None]
        out.append(Check("every flat run flagged (plateau)", f"{len(flat) - len(missed)}/"
                         f"{len(flat)}", not missed, _ids(missed)))
    healthy = [c for c in cases if c.group == "healthy"]
    if healthy:
        bad = [c for c in healthy if tg(c, "plateau", "warning") is not None]
        out.append(Check("no plateau finding on a healthy run", f"{len(bad)}/{len(healthy)} "
                         "fired", not bad, _ids(bad)))
    out += _family_plateau_checks(cases)
    overfit = [c for c in cases if c.label == "overfit"]
    if overfit:
        missed = [c for c in overfit if tg(c, "overfit", "warning") is None]
        out.append(Check("every overfit run flagged (overfit)", f"{len(overfit) - len(missed)}/"
                         f"{len(overfit)}", not missed, _ids(missed)))
    stalls = [c for c in cases if c.label == "stalled"]
    if stalls:
        late = []
        for c in stalls:
            d = tg(c, "stall", "warning")
            if (d is None or d.time is None or c.onset_time is None or c.stall_bound_s is None
                    or d.time - c.onset_time > c.stall_bound_s):
                late.append(c)
        out.append(Check("every stall found within max(3 x p99 update interval, 10 min)",
                         f"{len(stalls) - len(late)}/{len(stalls)}", not late, _ids(late)))
    for group, what in (("injected:pause", "no stall on a legitimate pause"),
                        ("injected:heartbeat_pause",
                         "no stall on a 35-55 min checkpoint the job heartbeats through"),
                        ("healthy", "no stall on a healthy run (compile warm-up gaps)")):
        members = [c for c in cases if c.group == group and c.clock != "step"]
        if members:
            bad = [c for c in members if tg(c, "stall", "warning") is not None]
            out.append(Check(what, f"{len(bad)}/{len(members)} fired", not bad, _ids(bad)))
    slowed = [c for c in cases if c.label == "slowed"]
    if slowed:
        late = []
        for c in slowed:
            d = tg(c, "slowdown", "warning")
            if d is None or d.time is None or c.onset_time is None \
                    or d.time - c.onset_time > SLOWDOWN_BOUND_S:
                late.append(c)
        out.append(Check("every injected slowdown and straggler found within 15 min",
                         f"{len(slowed) - len(late)}/{len(slowed)}", not late, _ids(late)))
    for group, what in (("healthy", "no slowdown on a healthy run (its own speed changes)"),
                        ("spiky", "no slowdown on a spiky run"),
                        ("injected:pause", "no slowdown on a legitimate pause"),
                        ("injected:heartbeat_pause", "no slowdown on a long checkpoint")):
        members = [c for c in cases if c.group == group and c.clock != "step"]
        if members:
            bad = [c for c in members if tg(c, "slowdown", "warning") is not None]
            out.append(Check(what, f"{len(bad)}/{len(members)} fired", not bad, _ids(bad)))
    for h in heads:
        if h.verdict and h.bad.runs:
            passed = (True if h.verdict.startswith("trainguard better")
                      else None if h.verdict.startswith("tie") else False)
            where = "" if h.family == ALL else f" in family {h.family}"
            out.append(Check(f"trainguard {h.kind} vs {h.detector}{where}", h.verdict, passed))
    return out


#: The issue's plateau bar, in every family with at least this many runs of the two labels.
PLATEAU_FAMILY_MIN_RUNS = 5
PLATEAU_MIN_RECALL, PLATEAU_MAX_WARNED = 0.90, 0.03


def _family_plateau_checks(cases: list[Case]) -> list[Check]:
    """Plateau recall >= 90 % with at most 3 % of healthy runs warned, per family."""
    out = []
    real = [c for c in cases if c.injected is None]
    for family in families(real):
        flat = [c for c in real if c.family == family and c.label == "flat"]
        healthy = [c for c in real if c.family == family and c.label == "healthy"]
        if len(flat) + len(healthy) < PLATEAU_FAMILY_MIN_RUNS or not (flat or healthy):
            continue

        def warned(c: Case) -> bool:
            return c.trainguard.get("plateau", {}).get("warning") is not None

        found = [c for c in flat if warned(c)]
        false = [c for c in healthy if warned(c)]
        recall_ok = not flat or len(found) >= PLATEAU_MIN_RECALL * len(flat)
        false_ok = len(false) <= PLATEAU_MAX_WARNED * len(healthy)
        out.append(Check(
            f"plateau in family {family}: recall >= 90 %, healthy warned <= 3 %",
            f"flat {len(found)}/{len(flat)}, healthy warned {len(false)}/{len(healthy)}",
            recall_ok and false_ok, _ids([c for c in flat if not warned(c)] + false)))
    return out


@dataclass
class Bench:
    labels: str
    policy: str
    settings: Settings
    runs: int
    cases: list[Case]  # every case, judgement calls included
    rows: list[Row]
    heads: list[HeadToHead]
    checks: list[Check]
    skipped: list[str]  # injected faults a run was too short to carry
    calls: list[Call] = field(default_factory=list)  # UNSURE labels: shown, not counted
    not_judged: list[NotJudged] = field(default_factory=list)  # runs that cannot be read
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class Call:
    """A run whose label is a judgement call, and what each detector concluded on it: on a
    failure label, trainguard's rule of that kind and the tools competing with it; on a
    healthy or spiky one, every detector (anything it flags would be a false alarm)."""

    run: str
    label: str
    family: str
    trainguard: str  # what trainguard concluded, in words
    agrees: bool  # trainguard concluded what the label says
    fired: list[str]  # the tools that fired
    silent: list[str]  # the tools that did not


def _said(d: Detection) -> str:
    where = f" at step {d.step:g}" if d.step is not None else ""
    return f"{d.severity}{where}: {d.reason}"


def call(c: Case) -> Call:
    kind = KIND_OF_LABEL.get(c.label)
    names = [n for n, k in detectors() if kind is None or k == kind]
    tools = list(dict.fromkeys(n for n in names if tg_kind(n) is None))
    fired = [n for n in tools if c.detection(n) is not None]
    if kind is not None:
        d = c.detection(tg_name(kind))
        seen = d or c.trainguard.get(kind, {}).get("warning")
        if seen is None:  # what the other rules made of it
            said = "; ".join([f"no {kind} finding"] + [
                f"{k} {_said(w)}" for k, levels in c.trainguard.items()
                if (w := levels.get("critical") or levels.get("warning")) is not None])
        else:
            said = f"{kind} {_said(seen)}" + ("" if d is not None else
                f" (not counted: {c.label} needs {JUDGES[kind].min_severity.value})")
        agrees = d is not None
    else:
        flagged = [k for k in JUDGES if c.detection(tg_name(k)) is not None]
        said = ("; ".join(f"{k} {_said(d)}" for k in flagged
                          if (d := c.detection(tg_name(k))) is not None) or "nothing flagged")
        agrees = not flagged
    return Call(c.run, c.label, c.family, said, agrees, fired,
                [n for n in tools if n not in fired])


def summarise(labels: str, policy: str, rows_in: list[Labelled], every: list[Case],
              settings: Settings, not_judged: list[NotJudged] | None = None) -> Bench:
    cases = [c for c in every if not c.unsure]
    heads = head_to_head(cases, settings)
    skipped: list[str] = []
    if settings.inject:
        have = {(c.run, c.injected) for c in cases}
        skipped = [f"{c.run}#{k}" for c in cases if c.injected is None
                   and c.label == "healthy" and c.clock != "step"
                   for k in INJECTORS if (c.run, k) not in have]
    return Bench(labels, policy, settings, len(rows_in), every, detail_rows(cases, settings),
                 heads, bar_checks(cases, heads), skipped,
                 [call(c) for c in every if c.unsure], list(not_judged or []))


@dataclass(frozen=True)
class Disagreement:
    case: Case
    rule: str
    anchor: str
    what: str  # who fired and who did not, and whether that was right


def disagreements(cases: list[Case], limit: int = 8) -> list[Disagreement]:
    """Cases where trainguard's rule and an anchor of the same kind disagree: at most one
    per (anchor, who fired, label) and per case, half of them (at most) trainguard's
    mistakes and the rest the anchors', in the labels file's order.

    Stalls are left out: their detections fall after the last record, off a run's plot."""
    found: dict[tuple[str, bool, bool], Disagreement] = {}
    used: set[str] = set()
    for c in cases:
        for name, kind in detectors():
            if tg_kind(name) is not None or kind == "stall" or c.id in used or c.unsure:
                continue
            tg = c.detection(tg_name(kind)) is not None
            other = c.detection(name) is not None
            bad = c.label == JUDGES[kind].label
            key = (name, tg, bad)
            if tg == other or key in found or (not bad and c.label not in NEGATIVE):
                continue  # agreeing, seen, or a failure of another kind (no one is wrong)
            who, whom = (tg_name(kind), name) if tg else (name, tg_name(kind))
            verdict = "right" if tg == bad else "wrong"
            found[key] = Disagreement(c, kind, name, f"{who} fired on this {c.group} run and "
                                      f"{whom} did not (trainguard {verdict})")
            used.add(c.id)
    wrong = [d for d in found.values() if d.what.endswith("(trainguard wrong)")]
    picked = wrong[: limit // 2]
    return picked + [d for d in found.values() if d not in wrong][: limit - len(picked)]


def as_dict(obj: Any) -> Any:
    """Dataclasses to plain data for JSON, with NaN and inf as null."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: as_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if f.name != "katib_series"}
    if isinstance(obj, dict):
        return {str(k): as_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [as_dict(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
