"""JSON lines: one object per line with a step, a time and metrics.

``{"step": 10, "time": 1718000000.5, "loss": 2.31, "val": {"loss": NaN}}``: nested objects
become ``val/loss``; NaN may be written as NaN or as the string "nan"; other strings are
labels, not metrics, and are skipped.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

from trainguard.adapters.local.base import Reader, RunBuilder, head, open_text, plain_name
from trainguard.adapters.local.definitions import MetricDefinition
from trainguard.adapters.local.errors import FormatError
from trainguard.adapters.local.keyed import KeyedRecords, role

_NONFINITE = {"nan": math.nan, "+nan": math.nan, "-nan": math.nan, "inf": math.inf,
              "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
              "+infinity": math.inf, "-infinity": -math.inf}


def _flatten(obj: dict[str, Any], prefix: str, out: list[tuple[str, str | float]]) -> None:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int | float):
            out.append((name, float(value)))
        elif isinstance(value, dict):
            _flatten(value, name + "/", out)
        elif isinstance(value, str):
            low = value.strip().lower()
            if low in _NONFINITE:
                out.append((name, _NONFINITE[low]))
            elif role(name) != "metric":
                out.append((name, value))  # a time as ISO text, or a step as text
            else:
                with contextlib.suppress(ValueError):  # else a label: "phase": "train"
                    out.append((name, float(value)))


class JsonLinesReader(Reader):
    name = "jsonl"

    def matches_name(self, path: Path) -> bool:
        return path.is_file() and plain_name(path).endswith((".jsonl", ".ndjson"))

    def matches_content(self, path: Path) -> bool:
        if not path.is_file():
            return False
        lines = head(path).splitlines()
        if len(lines) < 1 or not lines[0].lstrip().startswith("{"):
            return False
        try:
            return isinstance(json.loads(lines[0]), dict)
        except ValueError:
            return False

    def collect(self, path: Path, run: RunBuilder, definitions: list[MetricDefinition] | None,
                select: str | None) -> None:
        records = KeyedRecords(path, run, "key")
        with open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    if not line.endswith("\n") and f.read(1) == "":
                        break  # the last line is still being written
                    raise FormatError(path, f"not valid JSON: {e}", lineno) from None
                if not isinstance(obj, dict):
                    raise FormatError(path, f"expected a JSON object, found "
                                      f"{type(obj).__name__}", lineno)
                fields: list[tuple[str, str | float]] = []
                _flatten(obj, "", fields)
                records.add(fields, lineno, epoch_is_step=True)
        records.finish()
