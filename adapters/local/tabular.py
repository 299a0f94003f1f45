"""CSV metric files: PyTorch Lightning ``metrics.csv``, Keras ``CSVLogger`` and
stable-baselines3's ``progress.csv`` and ``monitor.csv``.

Lightning writes sparse rows (``step,epoch`` plus the metrics logged at that step): an
empty cell is a missing value, the literal ``nan`` is a NaN and is kept. Keras writes one
row per epoch (``epoch,loss,val_loss,...``) and the epoch is the step. stable-baselines3's
``Monitor`` writes a ``#{"t_start": ..., "env_id": ...}`` line above its header and one row
per episode, ``r,l,t`` (its return, its length in environment steps, the seconds since
``t_start``): read as ``episode_reward``, ``episode_length`` and the wall clock, on the
environment steps taken by the episode's end.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path

from trainguard.adapters.local.base import Reader, RunBuilder, head, open_text, plain_name
from trainguard.adapters.local.definitions import MetricDefinition
from trainguard.adapters.local.errors import FormatError
from trainguard.adapters.local.keyed import KeyedRecords, role


class CsvReader(Reader):
    name = "csv"

    def matches_name(self, path: Path) -> bool:
        if path.is_dir():
            return (path / "metrics.csv").is_file()
        return plain_name(path).endswith((".csv", ".tsv"))

    def matches_content(self, path: Path) -> bool:
        if not path.is_file():
            return False
        first = next(_uncommented(head(path, 2048)), "").strip().lower()
        sep = "\t" if plain_name(path).endswith(".tsv") else ","
        names = [c.strip() for c in first.split(sep)]
        return len(names) >= 2 and any(role(n) in ("step", "epoch") for n in names)

    def sniff(self, path: str | Path) -> bool:
        """When a folder is searched, a CSV counts as a run only if it has a step or epoch
        column: a labels file or a results table beside the runs is not one."""
        p = Path(path)
        if p.is_dir():
            return (p / "metrics.csv").is_file()
        return self.matches_content(p)

    def default_id(self, path: Path) -> str:
        # Lightning: lightning_logs/version_3/metrics.csv is run "version_3"
        if path.is_dir():
            return path.name
        if plain_name(path) == "metrics.csv" and path.parent.name:
            return path.parent.name
        return super().default_id(path)

    def collect(self, path: Path, run: RunBuilder, definitions: list[MetricDefinition] | None,
                select: str | None) -> None:
        if path.is_dir():
            path = path / "metrics.csv"
        delimiter = "\t" if plain_name(path).endswith(".tsv") else ","
        with open_text(path) as f:
            text = f.read()
        # A file being written may end in half a row. Such a row is read if it can be
        # and skipped if it cannot: the next read sees it whole. A complete file (ending
        # in a newline) gets no such leniency.
        partial_tail = bool(text) and not text.endswith("\n")
        comments = _comments(text)
        text = text.split("\n", len(comments))[-1] if comments else text
        reader = csv.reader(io.StringIO(text), delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            return  # an empty file: a run that has just started
        header = [h.strip() for h in header]
        at = len(comments) + 1  # the header's line
        if len(header) == 1 and (other := _other_separator(header[0], delimiter)):
            raise FormatError(path, f"the header {header[0]!r} reads as one column: are its "
                              f"cells separated by {other}? write them with "
                              f"{delimiter!r} between them"
                              + (", or name the file .tsv" if other == "a tab" else ""), at)
        if len(set(header)) != len(header):
            dup = next(h for h in header if header.count(h) > 1)
            raise FormatError(path, f"column {dup!r} appears twice in the header", at)
        t_start = _monitor_start(comments, header)
        if t_start is not None:
            header = [*_MONITOR_NAMES, *header[3:]]
        roles = [role(h) for h in header]
        epoch_is_step = "step" not in roles
        records = KeyedRecords(path, run, "column")
        width = len(header)
        rows = list(reader)
        last = len(rows) - 1
        steps = 0.0  # a monitor's environment steps so far
        for i, row in enumerate(rows):
            line = i + 2 + len(comments)
            if not row:
                continue
            try:
                if len(row) > width:
                    raise FormatError(path, f"row has {len(row)} cells but the header has "
                                      f"{width} columns", line)
                fields: list[tuple[str, str | float]] = [
                    (header[i], cell) for i, cell in enumerate(row) if cell.strip()]
                if t_start is not None:
                    steps, fields = _episode(fields, steps, t_start, records, line)
                records.add(fields, line, epoch_is_step)
            except FormatError:
                if i == last and partial_tail:
                    break
                raise
        records.finish()


_MONITOR_NAMES = ("episode_reward", "episode_length", "episode_time")


def _uncommented(text: str) -> Iterator[str]:
    """The lines of ``text`` after the ``#`` lines at its top."""
    yield from text.split("\n", len(_comments(text)))[-1].split("\n")


def _comments(text: str) -> list[str]:
    """The ``#`` lines at the top of ``text`` (read up to the first other line only)."""
    out: list[str] = []
    at = 0
    while text.startswith("#", at):
        end = text.find("\n", at)
        out.append(text[at:] if end < 0 else text[at:end])
        if end < 0:
            break
        at = end + 1
    return out


def _monitor_start(comments: list[str], header: list[str]) -> float | None:
    """``t_start`` (epoch seconds) of a stable-baselines3 monitor file, or None when the
    file is none: its first line ``#{"t_start": ...}``, its header ``r,l,t`` (then any
    ``info_keywords``)."""
    if not comments or header[:3] != ["r", "l", "t"]:
        return None
    try:
        meta = json.loads(comments[0][1:])
    except ValueError:
        return None
    start = meta.get("t_start") if isinstance(meta, dict) else None
    return float(start) if isinstance(start, int | float) else None


def _episode(fields: list[tuple[str, str | float]], steps: float, t_start: float,
             records: KeyedRecords, line: int) -> tuple[float, list[tuple[str, str | float]]]:
    """A monitor's row: its step (the environment steps by the episode's end) and its
    time (``t_start`` + ``t``) put in as fields of their own."""
    cells = dict(fields)
    length = records.number("l", cells.get("episode_length", "nan"), line)
    if math.isfinite(length):
        steps += length
    seconds = records.number("t", cells.pop("episode_time", "nan"), line)
    out = [*cells.items(), ("step", steps)]
    if math.isfinite(seconds):
        out.append(("timestamp", t_start + seconds))
    return steps, out


def _other_separator(header: str, delimiter: str) -> str | None:
    """The separator a one-column header holds instead of ``delimiter``: a spreadsheet in a
    locale with decimal commas writes ';' between cells ("step;loss", then "1;0,5")."""
    for sep, name in ((";", "';'"), ("\t", "a tab"), (",", "','")):
        if sep != delimiter and sep in header:
            return name
    return None
