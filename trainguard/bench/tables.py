"""The benchmark's output: rich tables for people, JSON for machines.

The tables are, in order: the head-to-head of each trainguard rule against the tools
that compete with it, the issue's bar, and every detector on every label group (rows
for a detector only where its numbers mean something: its own failure label and the
healthy and spiky groups; the JSON has them all), then the judgement calls (runs whose
label is marked UNSURE, counted nowhere else) and the runs that cannot be read. With
``--by family`` the head-to-head and the per-label table repeat for each family, after
the rows over all runs.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from trainguard.bench.harness import ALL, JUDGES, Bench, HeadToHead, Row, as_dict, tg_kind
from trainguard.bench.labels import NEGATIVE
from trainguard.replay import LIVE_TICK_S, MAX_AUTO_TICKS


def _n(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "—"
    if abs(x) >= 100 or float(x).is_integer():
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def _money(x: float | None) -> str:
    return "—" if x is None else f"${x:,.0f}"


def _delay(steps: float | None, minutes: float | None) -> str:
    if steps is None and minutes is None:
        return "—"
    parts = [f"{_n(steps)} st" if steps is not None else "", f"{_n(minutes)} min"
             if minutes is not None else ""]
    return " / ".join(p for p in parts if p)


def _count(n: int, of: int) -> str:
    return f"{n}/{of} ({100 * n / of:.0f}%)" if of else "—"


def _ticks(tick: float | None, step_tick: float | None) -> str:
    timed = (f"every {tick:g} s" if tick is not None else
             f"every logging interval but no more often than every {LIVE_TICK_S:g} s")
    steps = (f"every {step_tick:g} steps" if step_tick is not None else
             "every logging interval")
    auto = f", at most {MAX_AUTO_TICKS:,} per run" if None in (tick, step_tick) else ""
    return f"{timed} ({steps} on runs without a time axis){auto}"


def header(bench: Bench) -> list[str]:
    s = bench.settings
    injected = sum(1 for c in bench.cases if c.injected)
    lines = [
        f"trainguard bench: {bench.labels}: {bench.runs} runs, {len(bench.cases)} cases"
        + (f" ({injected} injected, seed {s.seed})" if s.inject else "")
        + f"; policy {bench.policy}; replay ticks {_ticks(s.tick, s.step_tick)}, "
          "detections timed to the record between ticks",
        f"price: ${s.price.usd_per_hour:,.2f}/h for {s.price.gpus} GPUs per run ({s.price.source})",
        f"savings: diverged and flat runs from detection to their last record; stalled runs "
        f"from detection to the job's max runtime, assumed SageMaker's default "
        f"MaxRuntimeInSeconds {s.max_runtime_s:,.0f} s counted from the stall's onset; a false "
        "alarm throws away what the run had spent so far",
    ]
    if bench.calls:
        lines.append(f"judgement calls: {len(bench.calls)} of the runs have a label marked "
                     "UNSURE: shown apart, counted nowhere else")
    if bench.not_judged:
        lines.append(f"not judged: {len(bench.not_judged)} of the runs cannot be read "
                     "(listed at the end, and on stderr): counted nowhere")
    if bench.skipped:
        lines.append(f"not injected: {len(bench.skipped)} faults on runs too short to carry "
                     "them (fewer than 10 logged loss points)")
    return lines


def _by_family(bench: Bench) -> list[str]:
    return list(dict.fromkeys([ALL, *(r.family for r in bench.rows)]))


def head_table(bench: Bench, family: str = ALL) -> Table:
    where = "" if family == ALL else f" (family {family})"
    t = Table(title=f"Head to head: each rule against today's tools{where}",
              title_justify="left")
    for col in ("rule (label)", "detector", "recall", "false alarms", "median delay", "max delay",
                "saved GPU-h", "saved", "thrown away", "vs trainguard"):
        t.add_column(col, overflow="fold")
    heads: list[HeadToHead] = [h for h in bench.heads if h.family == family]
    kinds = list(dict.fromkeys(h.kind for h in heads))
    for h in heads:
        is_tg = tg_kind(h.detector) is not None
        last = [x for x in heads if x.kind == h.kind][-1] is h
        t.add_row(
            f"{h.kind} ({JUDGES[h.kind].label})" if is_tg else "",
            f"[bold]{h.detector}[/]" if is_tg else h.detector,
            _count(h.bad.flagged, h.bad.runs),
            _count(h.healthy.flagged, h.healthy.runs),
            _delay(h.bad.delay_steps_median, h.bad.delay_min_median),
            _delay(h.bad.delay_steps_max, h.bad.delay_min_max),
            _n(h.bad.saved_gpu_hours), _money(h.bad.saved_usd), _money(h.healthy.lost_usd),
            h.verdict, end_section=last and h.kind != kinds[-1],
        )
    return t


def bar_table(bench: Bench) -> Table:
    t = Table(title="The bar (issues 3 and 11)", title_justify="left")
    for col in ("", "check", "result", "runs that broke it"):
        t.add_column(col, overflow="fold")
    for c in bench.checks:
        mark = ("[green]✓[/]" if c.passed else "[yellow]=[/]" if c.passed is None
                else "[red]✗[/]")
        shown = ", ".join(c.detail[:3]) + (f" and {len(c.detail) - 3} more"
                                             if len(c.detail) > 3 else "")
        t.add_row(mark, c.what, c.result, shown)
    return t


def _shown(row: Row) -> bool:
    """A detector's row on its own failure label and on the healthy and spiky groups."""
    return row.label in (*NEGATIVE, JUDGES[row.kind].label)


def detail_table(bench: Bench, family: str = ALL) -> Table:
    where = "" if family == ALL else f" (family {family})"
    t = Table(title=f"Every detector per label{where}", title_justify="left")
    for col in ("detector", "label", "runs", "flagged", "warn+ / crit", "median delay",
                "max delay", "saved GPU-h", "saved", "thrown away"):
        t.add_column(col, overflow="fold")
    rows = [r for r in bench.rows if _shown(r) and r.family == family]
    for i, r in enumerate(rows):
        levels = f"{r.warned} / {r.critical}" if r.warned is not None else ""
        t.add_row(r.detector, r.group, str(r.runs), _count(r.flagged, r.runs), levels,
                  _delay(r.delay_steps_median, r.delay_min_median),
                  _delay(r.delay_steps_max, r.delay_min_max),
                  _n(r.saved_gpu_hours), _money(r.saved_usd), _money(r.lost_usd),
                  end_section=i + 1 < len(rows) and rows[i + 1].detector != r.detector)
    return t


def calls_table(bench: Bench) -> Table:
    t = Table(title="Judgement calls (labels marked UNSURE: not counted above)",
              title_justify="left")
    for col in ("run", "label", "trainguard", "agrees", "tools that fired", "silent"):
        t.add_column(col, overflow="fold")
    for c in bench.calls:
        t.add_row(c.run, c.label, c.trainguard, "yes" if c.agrees else "no",
                  ", ".join(c.fired) or "none", ", ".join(c.silent) or "none")
    return t


def print_tables(console: Console, bench: Bench) -> None:
    from trainguard.report import fit_output

    fit_output(console)  # whole rows in a pipe or a CI log, not 80-column boxes
    for line in header(bench):
        console.print(line, highlight=False)
    console.print()
    families = _by_family(bench)
    console.print(head_table(bench))
    console.print(bar_table(bench))
    console.print(detail_table(bench))
    if bench.calls:
        console.print(calls_table(bench))
    for family in families[1:]:
        if any(h.family == family for h in bench.heads):  # none: no failure in that family
            console.print(head_table(bench, family))
        console.print(detail_table(bench, family))
    if bench.not_judged:
        console.print(not_judged_table(bench))
    console.print(f"{len(bench.cases)} cases in {bench.elapsed_s:.1f} s", highlight=False)


def not_judged_table(bench: Bench) -> Table:
    t = Table(title="Not judged: runs that cannot be read (fix the file or its labels row)",
              title_justify="left")
    for col in ("run", "why"):
        t.add_column(col, overflow="fold")
    for n in bench.not_judged:
        t.add_row(n.run, n.error)
    return t


def to_json(bench: Bench) -> dict[str, Any]:
    s = bench.settings
    return {
        "labels": bench.labels,
        "policy": bench.policy,
        "runs": bench.runs,
        "cases": len(bench.cases),
        "settings": {"tick_s": s.tick, "step_tick": s.step_tick, "inject": s.inject,
                     "seed": s.seed, "resolution_s": s.resolution_s,
                     "by_family": s.by_family},
        "price": as_dict(s.price),
        "assumptions": {"max_runtime_s": s.max_runtime_s, "notes": header(bench)[1:]},
        "head_to_head": [
            {"detector": h.detector, "rule": h.kind, "label": JUDGES[h.kind].label,
             "family": h.family,
             "recall": h.bad.rate, "false_alarm_rate": h.healthy.rate,
             "bad": as_dict(h.bad), "healthy": as_dict(h.healthy), "verdict": h.verdict}
            for h in bench.heads],
        "bar": as_dict(bench.checks),
        "rows": [{**as_dict(r), "rate": r.rate} for r in bench.rows],
        "skipped_injections": bench.skipped,
        "not_judged": as_dict(bench.not_judged),
        "judgement_calls": as_dict(bench.calls),
        "runs_detail": as_dict(bench.cases),
        "elapsed_s": bench.elapsed_s,
    }


def dumps(bench: Bench) -> str:
    return json.dumps(to_json(bench), indent=1, allow_nan=False)
