"""CSV metric files: PyTorch Lightning ``metrics.csv`` and Keras ``CSVLogger``.

Lightning writes sparse rows (``step,epoch`` plus the metrics logged at that step): an
empty cell is a missing value, the literal ``nan`` is a NaN and is kept. Keras writes one
row per epoch (``epoch,loss,val_loss,...``) and the epoch is the step.
"""

from __future__ import annotations

import csv
import io
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
        first = head(path, 2048).partition("\n")[0].strip().lower()
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
        reader = csv.reader(io.StringIO(text), delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            return  # an empty file: a run that has just started
        header = [h.strip() for h in header]
        if len(header) == 1 and (other := _other_separator(header[0], delimiter)):
            raise FormatError(path, f"the header {header[0]!r} reads as one column: are its "
                              f"cells separated by {other}? write them with "
                              f"{delimiter!r} between them"
                              + (", or name the file .tsv" if other == "a tab" else ""), 1)
        if len(set(header)) != len(header):
            dup = next(h for h in header if header.count(h) > 1)
            raise FormatError(path, f"column {dup!r} appears twice in the header", 1)
        roles = [role(h) for h in header]
        epoch_is_step = "step" not in roles
        records = KeyedRecords(path, run, "column")
        width = len(header)
        rows = list(reader)
        last = len(rows) - 1
        for i, row in enumerate(rows):
            line = i + 2
            if not row:
                continue
            try:
                if len(row) > width:
                    raise FormatError(path, f"row has {len(row)} cells but the header has "
                                      f"{width} columns", line)
                fields = [(header[i], cell) for i, cell in enumerate(row) if cell.strip()]
                records.add(fields, line, epoch_is_step)
            except FormatError:
                if i == last and partial_tail:
                    break
                raise
        records.finish()


def _other_separator(header: str, delimiter: str) -> str | None:
    """The separator a one-column header holds instead of ``delimiter``: a spreadsheet in a
    locale with decimal commas writes ';' between cells ("step;loss", then "1;0,5")."""
    for sep, name in ((";", "';'"), ("\t", "a tab"), (",", "','")):
        if sep != delimiter and sep in header:
            return name
    return None
