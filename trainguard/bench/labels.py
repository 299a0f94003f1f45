"""A labels file: which runs to replay and what a detector should conclude about each.

The format is that of ``../shared/data/curves/labels.csv`` (its SOURCES.md): a CSV
with a header and one row per run. Only ``run`` and ``label`` are required; the
other columns may be absent or empty.

``run``           the run's path, relative to the labels file's folder
``source``        where it came from (free text)
``format``        a reader name (``text``, ``csv``, ``hf``, ``jsonl``...; ``json`` is ``hf``);
                  empty: detected
``label``         ``healthy``; ``spiky`` (a blow-up the run recovers from, ending healthy:
                  any critical finding on it is a false alarm); ``diverged``, ``flat``,
                  ``overfit`` or ``stalled``
``family``        the recipe family the run belongs to (``bench --by family``); empty: the
                  run's first folder
``onset_step``    the first step where the failure shows (>= 0)
``planned_steps``, ``last_step``  the run's planned and last logged step (integers >= 0)
``target_metric`` the metric that says whether the run succeeded (anchors watch it)
``target_value``, ``final_value``  numbers
``reached``       ``true`` or ``false``
``metrics``       a text log's metric definitions, ``NAME=REGEX`` joined by ``;``, one
                  capture group each; ``step`` gives the step (``adapters.local``); empty:
                  the default definitions
``notes``         free text; the word ``UNSURE`` in it marks the label a judgement call
                  (the runs corpus's SOURCES.md: "not as ground truth to fit"): ``bench``
                  shows what every detector concludes on such a run, apart, and leaves it
                  out of recall, false alarms and the bar

Every problem is reported as ``FILE:LINE: column: reason``, all at once.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from trainguard.adapters.local import MetricDefinition

#: What a detector should conclude. ``healthy`` and ``spiky`` runs end healthy: whatever
#: a detector does on them is a false alarm; the others name a failure.
LABELS = ("healthy", "spiky", "diverged", "flat", "overfit", "stalled")
NEGATIVE = ("healthy", "spiky")
REQUIRED = ("run", "label")
#: Other names a labels file may give a format.
FORMAT_ALIASES = {"json": "hf"}
#: The family of a run at the labels file's own level (no folder to name it by).
NO_FAMILY = "(none)"
#: A label its author was not sure of, in the ``notes`` column.
_UNSURE = re.compile(r"\bUNSURE\b")
#: Where one definition ends in a ``metrics`` cell: a ``;`` before the next ``NAME=``.
_NEXT_DEFINITION = re.compile(r";(?=\s*[A-Za-z_][\w.]*\s*=)")
T = TypeVar("T")


@dataclass(frozen=True)
class Labelled:
    run: str  # as written in the file
    path: Path  # resolved against the labels file's folder
    line: int
    label: str
    format: str | None = None
    source: str = ""
    family: str = NO_FAMILY
    metrics: tuple[MetricDefinition, ...] = ()  # a text log's definitions; () the defaults
    labels: Path | None = None  # the labels file it was read from
    unsure: bool = False  # a judgement call: shown apart, not counted

    @property
    def where(self) -> str:
        """``FILE:LINE`` of this row, for messages."""
        return f"{self.labels}:{self.line}" if self.labels is not None else str(self.line)
    onset_step: float | None = None
    planned_steps: int | None = None
    last_step: int | None = None
    target_metric: str | None = None
    target_value: float | None = None
    final_value: float | None = None
    reached: bool | None = None

    @property
    def group(self) -> tuple[str, str, str, str]:
        """Runs of one experiment (Katib's "other trials"): same folder, metric and target,
        and the same repository where ``source`` names one (``owner/repo@commit:path``):
        runs of unrelated projects in one folder are no trials of one experiment."""
        return (Path(self.run).parent.as_posix(), self.source.partition("@")[0],
                self.target_metric or "",
                "" if self.target_value is None else repr(self.target_value))


class LabelsError(Exception):
    """Everything wrong with one labels file, one ``FILE:LINE: column: reason`` per line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be a finite number >= 0")
    return value


def _whole(text: str) -> int:
    value = _number(text)
    if value != int(value):
        raise ValueError("must be a whole number")
    return int(value)


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("true", "yes", "1"):
        return True
    if low in ("false", "no", "0"):
        return False
    raise ValueError("must be true or false")


def _known_formats() -> list[str]:
    from trainguard.adapters.local import FORMATS

    return sorted(FORMATS)


def family_of(run: str) -> str:
    """A run's family when the labels file names none: its first folder."""
    parts = Path(run).parts
    return parts[0] if len(parts) > 1 else NO_FAMILY


def parse_metrics(text: str) -> tuple[MetricDefinition, ...]:
    """``NAME=REGEX;NAME=REGEX``: one definition per part, each regex with one group.

    A part ends at a ``;`` followed by the next ``NAME=``, so a regex may hold a ``;``
    of its own elsewhere. ``ValueError`` says which part is wrong and why."""
    from trainguard.adapters.local import MetricDefinition

    out = []
    for part in _NEXT_DEFINITION.split(text):
        name, sep, regex = part.partition("=")
        name = name.strip()
        if not sep or not name or not regex:
            raise ValueError(f"{part!r} is not NAME=REGEX")
        if not re.fullmatch(r"[A-Za-z_][\w.]*", name):
            raise ValueError(f"{name!r} is not a metric name (letters, digits, _ and .)")
        definition = MetricDefinition(name, regex)
        definition.compile()  # one capture group, a valid regex: or a ValueError saying so
        out.append(definition)
    names = [d.name for d in out]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"{', '.join(twice)} defined twice")
    return tuple(out)


def read_labels(path: str | Path, check_files: bool = True) -> list[Labelled]:
    """Every row of the labels file at ``path``; ``LabelsError`` naming each bad row."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise LabelsError([f"{path}: no such file"]) from None
    except IsADirectoryError:
        raise LabelsError([f"{path}: is a folder, not a labels CSV"]) from None
    except UnicodeDecodeError as e:
        raise LabelsError([f"{path}: not a text file ({e.reason})"]) from None
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise LabelsError([f"{path}:1: header: missing column(s) {', '.join(missing)} "
                           f"(have: {', '.join(header) or 'none'})"])
    formats = _known_formats()
    problems: list[str] = []
    rows: list[Labelled] = []
    seen: dict[str, int] = {}
    for raw in reader:
        row = _Row(path, reader.line_num, raw, len(header))
        item = row.parse(formats, seen, check_files)
        problems += row.problems
        if item is not None:
            rows.append(item)
    if problems:
        raise LabelsError(problems)
    if not rows:
        raise LabelsError([f"{path}: no runs listed"])
    return rows


class _Row:
    """One data row being read: its cells and what is wrong with them."""

    def __init__(self, path: Path, line: int, raw: dict[str | None, Any], width: int) -> None:
        self.path, self.line, self.width = path, line, width
        self.extra = raw.get(None)  # cells beyond the header's columns
        self.cells = {(k or "").strip(): v.strip() if isinstance(v, str) else ""
                      for k, v in raw.items() if k is not None}
        self.problems: list[str] = []

    def problem(self, column: str, reason: str) -> None:
        self.problems.append(f"{self.path}:{self.line}: {column}: {reason}")

    def get(self, column: str) -> str:
        return self.cells.get(column, "")

    def cell(self, column: str, parse: Callable[[str], T]) -> T | None:
        text = self.get(column)
        if not text:
            return None
        try:
            return parse(text)
        except ValueError as e:
            reason = "not a number" if str(e).startswith("could not convert") else str(e)
            self.problem(column, f"{text!r}: {reason}")
            return None

    def parse(self, formats: list[str], seen: dict[str, int],
              check_files: bool) -> Labelled | None:
        if self.extra:
            self.problem("row", f"{self.width + len(self.extra)} cells, "
                         f"the header has {self.width}")
        folder = self.path.parent
        run, label = self.get("run"), self.get("label")
        if not run:
            self.problem("run", "empty")
        elif run in seen:
            self.problem("run", f"{run!r} is listed twice (first on line {seen[run]})")
        else:
            seen[run] = self.line
            if check_files and not (folder / run).exists():
                self.problem("run", f"no such file or folder {run!r} under {folder}")
        if label not in LABELS:
            self.problem("label", f"{label!r} is not one of {', '.join(LABELS)}")
        fmt = self.get("format") or None
        fmt = FORMAT_ALIASES.get(fmt, fmt) if fmt is not None else None
        if fmt is not None and fmt not in formats:
            known = ", ".join(sorted([*formats, *FORMAT_ALIASES]))
            self.problem("format", f"{fmt!r} is not a known format ({known})")
        metrics = self.cell("metrics", parse_metrics) or ()
        if metrics and fmt not in (None, "text"):
            self.problem("metrics", f"metric definitions apply to text logs, and format is "
                         f"{fmt!r}")
        item = Labelled(
            run=run, path=folder / run, line=self.line, label=label, format=fmt,
            labels=self.path,
            source=self.get("source"), target_metric=self.get("target_metric") or None,
            family=self.get("family") or family_of(run), metrics=metrics,
            onset_step=self.cell("onset_step", _number),
            planned_steps=self.cell("planned_steps", _whole),
            last_step=self.cell("last_step", _whole),
            target_value=self.cell("target_value", _finite),
            final_value=self.cell("final_value", _finite),
            reached=self.cell("reached", _bool),
            unsure=_UNSURE.search(self.get("notes")) is not None,
        )
        return None if self.problems else item


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value
