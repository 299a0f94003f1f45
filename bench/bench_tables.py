"""Markdown tables for docs/benchmarks.md from ``trainguard bench --by family --format json``.

    .venv/bin/trainguard bench LABELS.csv... --by family --format json > bench.json
    python bench/bench_tables.py bench.json

Prints the head-to-head over every case as the command's table has it; then, per rule,
one table with a row per detector (trainguard's rule first, then each
tool that competes with it) and a column per family, each cell ``recall · false alarms on
healthy runs · on spiky runs`` over the real runs (injected faults are in the
``injected`` column); then the bar, and every place where a tool did better than
trainguard or the comparison is mixed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

NEGATIVE = ("healthy", "spiky")


def _cell(rows: dict[tuple[str, str, str], dict[str, Any]], detector: str, family: str,
          label: str, injected: bool = False) -> str:
    def count(group: str) -> str:
        r = rows.get((detector, family, group))
        return f"{r['flagged']}/{r['runs']}" if r is not None and r["runs"] else "—"

    if injected:
        bad = [g for (d, f, g) in rows if d == detector and f == family
               and g.startswith("injected:") and rows[(d, f, g)]["label"] == label]
        ok = [g for (d, f, g) in rows if d == detector and f == family
              and g.startswith("injected:") and rows[(d, f, g)]["label"] in NEGATIVE]

        def total(groups: list[str]) -> str:
            n = sum(rows[(detector, family, g)]["runs"] for g in groups)
            k = sum(rows[(detector, family, g)]["flagged"] for g in groups)
            return f"{k}/{n}" if n else "—"

        return f"{total(bad)} · {total(ok)}"
    return " · ".join([count(label), count("healthy"), count("spiky")])


def tables(data: dict[str, Any]) -> str:
    rows = {(r["detector"], r["family"], r["group"]): r for r in data["rows"]}
    families = sorted({f for (_, f, _) in rows if f != "all"})
    has_injected = any(g.startswith("injected:") for (_, _, g) in rows)
    kinds: dict[str, str] = {}
    detectors: dict[str, list[str]] = {}
    for h in data["head_to_head"]:
        if h["family"] == "all":
            kinds[h["rule"]] = h["label"]
            detectors.setdefault(h["rule"], []).append(h["detector"])
    out = ["Head to head over every case (real and injected), as the command prints it:\n",
           "| rule (label) | detector | found | false alarms (healthy or spiky) | median delay "
           "| vs trainguard |", "|---|---|---|---|---|---|"]
    for h in data["head_to_head"]:
        if h["family"] != "all":
            continue
        mine = h["detector"].startswith("trainguard")
        b = h["bad"]
        delay = " / ".join(x for x in (
            f"{b['delay_steps_median']:,.0f} st" if b["delay_steps_median"] is not None else "",
            f"{b['delay_min_median']:.3g} min" if b["delay_min_median"] is not None else "")
            if x) or "—"
        out.append(f"| {h['rule'] + ' (' + h['label'] + ')' if mine else ''} | "
                   f"{'**' + h['detector'] + '**' if mine else h['detector']} | "
                   f"{b['flagged']}/{b['runs']} | "
                   f"{h['healthy']['flagged']}/{h['healthy']['runs']} | "
                   f"{delay} | {h['verdict']} |")
    out.append("")
    out.append("Per family, real runs only:\n")
    for kind, label in kinds.items():
        cols = ["all (real runs)", *families] + (["injected"] if has_injected else [])
        out.append(f"**{kind}** (`{label}` runs found · false alarms on `healthy` · on "
                   "`spiky`)\n")
        out.append("| detector | " + " | ".join(cols) + " |")
        out.append("|---" * (len(cols) + 1) + "|")
        for det in detectors[kind]:
            cells = [_cell(rows, det, "all", label)]
            cells += [_cell(rows, det, f, label) for f in families]
            if has_injected:
                cells.append(_cell(rows, det, "all", label, injected=True))
            name = f"**{det}**" if det.startswith("trainguard") else det
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("")
    out.append("The bar (per-family verdicts only where trainguard did not win):\n")
    out.append("| | check | result | runs that broke it |")
    out.append("|---|---|---|---|")
    for c in data["bar"]:
        if " in family " in c["what"] and c["passed"] is not False:
            continue  # per-family verdicts: only those trainguard did not win
        mark = "✓" if c["passed"] else ("=" if c["passed"] is None else "✗")
        broke = ", ".join(f"`{d}`" for d in c["detail"][:4]) + (
            f" and {len(c['detail']) - 4} more" if len(c["detail"]) > 4 else "")
        out.append(f"| {mark} | {c['what']} | {c['result']} | {broke} |")
    out.append("")
    calls = data.get("judgement_calls") or []
    if calls:
        out.append("Judgement calls (labels marked UNSURE in the labels file: shown here, "
                   "counted nowhere above):\n")
        out.append("| run | label | trainguard | agrees | tools that fired |")
        out.append("|---|---|---|---|---|")
        for c in calls:
            out.append(f"| `{c['run']}` | {c['label']} | {c['trainguard']} | "
                       f"{'yes' if c['agrees'] else 'no'} | {', '.join(c['fired']) or 'none'} |")
        out.append("")
    weaker = [h for h in data["head_to_head"]
              if h["verdict"].startswith(("anchor better", "mixed"))]
    out.append("Where a tool did better than trainguard, or the comparison is mixed:\n")
    if not weaker:
        out.append("- nowhere")
    for h in weaker:
        out.append(f"- {h['rule']} in family {h['family']}: {h['detector']} "
                   f"{h['bad']['flagged']}/{h['bad']['runs']} found, "
                   f"{h['healthy']['flagged']}/{h['healthy']['runs']} false alarms: "
                   f"{h['verdict']}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("json", type=Path, nargs="?", help="bench JSON (default: stdin)")
    a = ap.parse_args()
    text = a.json.read_text() if a.json else sys.stdin.read()
    print(tables(json.loads(text)))


if __name__ == "__main__":
    main()
