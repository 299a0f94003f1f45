"""YOLOv5's ``results.txt``: one line per epoch, no header (releases before v6.0, 2021;
later ones write ``results.csv``, which the ``csv`` reader reads).

    "      0/99     1.86G   0.09831   0.09352         0    0.1918        24       416 ..."

Fifteen fields as ``train.py`` printed them: ``epoch/last`` (0-based), GPU memory, the
mean training box, objectness and class losses and their total, the targets and image size
of the last batch, then precision, recall, mAP@0.5, mAP@0.5:0.95 and the validation box,
objectness and class losses. They get ``results.csv``'s names, so a run reads the same
in either file; the total is left out as ``results.csv`` leaves it out (the training
objective is the sum of ``train/*_loss``). ``last`` is the planned last epoch.
"""

from __future__ import annotations

import re
from pathlib import Path

from trainguard.adapters.local.base import Reader, RunBuilder, head, open_text, plain_name
from trainguard.adapters.local.definitions import MetricDefinition
from trainguard.adapters.local.errors import FormatError
from trainguard.adapters.local.keyed import KeyedRecords

#: The names of fields 3-8 and 10-16 (1-based), as ``results.csv`` spells them; None: not
#: a metric (the total, the last batch's target count and image size).
COLUMNS: tuple[str | None, ...] = (
    "train/box_loss", "train/obj_loss", "train/cls_loss", None, None, None,
    "metrics/precision", "metrics/recall", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95",
    "val/box_loss", "val/obj_loss", "val/cls_loss")
_EPOCH = re.compile(r"(\d+)/(\d+)")
_MEMORY = re.compile(r"\d+(?:\.\d*)?[KMG]?")


def _fields(line: str) -> tuple[int, int, list[str]] | None:
    """(epoch, last epoch, the numeric fields) of a results line, or None."""
    parts = line.split()
    if len(parts) != 2 + len(COLUMNS):
        return None
    m = _EPOCH.fullmatch(parts[0])
    if m is None or not _MEMORY.fullmatch(parts[1]):
        return None
    return int(m[1]), int(m[2]), parts[2:]


class YoloResultsReader(Reader):
    name = "yolov5_txt"

    def matches_name(self, path: Path) -> bool:
        """A ``.txt`` whose first line has this layout (by its name alone, a .txt is text)."""
        if not path.is_file() or not plain_name(path).endswith(".txt"):
            return False
        first = next((line for line in head(path).splitlines() if line.strip()), "")
        if (found := _fields(first)) is None:
            return False
        try:
            [float(x) for x in found[2]]
        except ValueError:
            return False
        return True

    def collect(self, path: Path, run: RunBuilder, definitions: list[MetricDefinition] | None,
                select: str | None) -> None:
        records = KeyedRecords(path, run, "column")
        with open_text(path) as f:
            text = f.read()
        lines = text.splitlines()
        if not text.endswith("\n"):
            lines = lines[:-1]  # the last line is still being written
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            found = _fields(line)
            if found is None:
                raise FormatError(path, f"expected {2 + len(COLUMNS)} fields beginning "
                                  "'epoch/last memory' as YOLOv5's results.txt writes "
                                  f"them, found {len(line.split())}", lineno)
            epoch, last, cells = found
            run.planned_steps = last
            fields: list[tuple[str, str | float]] = [("epoch", float(epoch))]
            fields += [(name, cell) for name, cell in zip(COLUMNS, cells, strict=True)
                       if name is not None]
            records.add(fields, lineno, epoch_is_step=True)
        records.finish()
