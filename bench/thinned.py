"""The labelled real runs logged at a sparser cadence: does each still get its verdict?

    .venv/bin/python bench/thinned.py                       # both corpora, every 2, 3, 5
    .venv/bin/python bench/thinned.py --every 2 --jobs 2
    .venv/bin/python bench/thinned.py ../shared/data/runs/labels.csv --only hf/

The maintainers judge on runs of other projects, logged at other cadences. A run kept at
every k-th record of each of its series (from its first record, and from its k-th: both
phases) is the same training logged k times less often. Each is replayed with the
default policy as the live watchdog would see it, and held to its label's bar:
``healthy`` and ``spiky``: no critical finding and no ``plateau`` warning; ``diverged``:
a critical ``divergence``; ``flat``: a ``plateau`` warning; ``overfit``: an ``overfit``
finding. ``curves`` is taken at every twentieth run (its modded-nanogpt runs are many and
alike; ``--curves-every``).

Prints, per family and cadence, how many runs met their bar (a thinned run counts twice,
once per phase), then every run that met it as logged and not when thinned, with the
objective's points left: a rule needs some points to say anything (``plateau``: 5), so a
short run thinned may say nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.bench.harness import JUDGES, KIND_OF_LABEL, Judge, load  # noqa: E402
from trainguard.bench.labels import Labelled, read_labels  # noqa: E402
from trainguard.checker.metrics import primary  # noqa: E402
from trainguard.checker.model import Job, Series, Severity  # noqa: E402
from trainguard.checker.rules.plateau import PlateauParams  # noqa: E402
from trainguard.config import default_policy  # noqa: E402
from trainguard.replay import replay  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
Verdict = frozenset[tuple[str, Severity]]  # (rule, worst severity) of each finding


def thin(job: Job, k: int, phase: int) -> Job:
    """``job`` with every ``k``-th record of each series, from its ``phase``-th (a series
    of at most ``k`` records is kept whole)."""
    if k == 1:
        return job
    series = {}
    for name, s in job.series.items():
        cut = slice(phase, None, k) if len(s) > k else slice(None)
        series[name] = Series(name, s.time[cut], s.step[cut], s.value[cut])
    return dataclasses.replace(job, series=series)


def met(label: str, verdict: Verdict) -> bool:
    """Whether ``verdict`` meets ``label``'s bar: the finding ``bench`` counts as detecting
    a bad label (``JUDGES``); on a healthy or spiky run, nothing critical and no
    ``plateau`` detection."""
    if label in ("healthy", "spiky"):
        return (all(worst is not Severity.CRITICAL for _, worst in verdict)
                and not _detects(JUDGES["plateau"], verdict))
    kind = KIND_OF_LABEL.get(label)
    return kind is None or _detects(JUDGES[kind], verdict)


def _detects(judge: Judge, verdict: Verdict) -> bool:
    return any(rule == judge.rule and worst.rank >= judge.min_severity.rank
               for rule, worst in verdict)


def judge(row: Labelled, k: int, phase: int) -> tuple[Verdict, int]:
    """The verdict on ``row``'s run thinned, and how many points its objective kept."""
    # Logging less often comes before a later session's rewrites are set aside (which of
    # its records a session rewrites depends on which were logged), and a read job's
    # order of records is gone on a step clock: a file of several sessions is thinned
    # and judged with all of them, as the reader read every file before ``sessions.py``.
    job = thin(load(row, sessions=False), k, phase)
    policy = default_policy()
    objective = primary(job, policy, None)
    result = replay(job, policy)
    return (frozenset((h.rule, h.worst) for h in result.histories),
            len(objective) if objective is not None else 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("labels", nargs="*", type=Path,
                    default=[DATA / "curves" / "labels.csv", DATA / "runs" / "labels.csv"])
    ap.add_argument("--every", type=int, nargs="+", default=[2, 3, 5])
    ap.add_argument("--curves-every", type=int, default=20)
    ap.add_argument("--only", help="only runs whose path contains this")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    rows: list[Labelled] = []
    for path in args.labels:
        if not path.is_file():
            sys.exit(f"{path}: no labels file (lay ../shared/data beside the checkout)")
        got = read_labels(path)
        rows += got[::args.curves_every] if path.parent.name == "curves" else got
    rows = [r for r in rows if not args.only or args.only in r.run]
    cases = [(r, 1, 0) for r in rows] + [
        (r, k, phase) for r in rows for k in args.every for phase in (0, k - 1)]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(judge, *zip(*cases, strict=True)))
    as_logged = {id(r): results[i][0] for i, r in enumerate(rows)}
    tally: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    lost = []
    for (row, k, phase), (verdict, points) in zip(cases, results, strict=True):
        good = met(row.label, verdict)
        for fam in (row.family, "all"):
            t = tally[(f"{fam} {row.label}", k)]
            t[0] += good
            t[1] += 1
        if k > 1 and not good and met(row.label, as_logged[id(row)]):
            lost.append((row, k, phase, verdict, points))
    every = [1, *args.every]
    print("| family, label | " + " | ".join(
        "as logged" if k == 1 else f"every {k}" for k in every) + " |")
    print("|---|" + "---|" * len(every))
    for key in sorted({key for key, _ in tally}, key=lambda s: (s.startswith("all"), s)):
        cells = [f"{tally[(key, k)][0]}/{tally[(key, k)][1]}" for k in every]
        print(f"| {key} | " + " | ".join(cells) + " |")
    few = PlateauParams().min_points
    print(f"\nMet as logged, not when thinned: {len(lost)} cases, "
          f"{sum(points >= few for *_, points in lost)} of them with {few} or more points "
          "of the objective left (the objective's points left):\n")
    for row, k, phase, verdict, points in lost:
        said = ", ".join(sorted(f"{r} {w.value}" for r, w in verdict)) or "nothing"
        print(f"- {row.run} ({row.label}), every {k} from record {phase}: "
              f"{points} points; {said}")


if __name__ == "__main__":
    main()
