"""Training runs from local files: text logs, CSV, JSON lines, Hugging Face trainer state,
TensorBoard event files and MLflow stores, each read into a ``checker.model.Job``.

``load_run(path)`` picks the format (``detect_format``) and reads it; ``FORMATS`` maps a
format name to its reader. See README.md beside this file for the formats and the time axis.
"""

from __future__ import annotations

from pathlib import Path

from trainguard.adapters.local.base import Found, Reader
from trainguard.adapters.local.definitions import (
    DEFAULT_DEFINITIONS,
    MetricDefinition,
    load_definitions,
    parse_metric_option,
)
from trainguard.adapters.local.errors import FormatError
from trainguard.adapters.local.hf import HuggingFaceReader
from trainguard.adapters.local.ids import distinguishing_ids, run_parts
from trainguard.adapters.local.jsonl import JsonLinesReader
from trainguard.adapters.local.mlflow import MlflowReader
from trainguard.adapters.local.tabular import CsvReader
from trainguard.adapters.local.tensorboard import TensorBoardReader
from trainguard.adapters.local.text import TextReader
from trainguard.adapters.local.yolo import YoloResultsReader
from trainguard.checker.model import Job

# The order is the order content sniffing tries them in: the most specific first, and
# text, which reads anything, last.
FORMATS: dict[str, Reader] = {
    r.name: r
    # a Trainer output folder holds TensorBoard logs too: it is one run, the Trainer's
    for r in (MlflowReader(), HuggingFaceReader(), TensorBoardReader(), JsonLinesReader(),
              CsvReader(), YoloResultsReader(), TextReader())
}


def detect_format(path: str | Path) -> str:
    """The format of ``path``: by its name or extension first, then by its content;
    ``text`` when nothing else fits."""
    p = Path(path)
    if not p.exists():
        raise FormatError(p, "no such file or directory")
    for name, reader in FORMATS.items():
        if reader.matches_name(p):
            return name
    for name, reader in FORMATS.items():
        if reader.matches_content(p):
            return name
    if p.is_dir():
        raise FormatError(p, "a folder with no TensorBoard event files, MLflow store, "
                          "trainer_state.json or metrics.csv in it")
    return "text"


def load_run(path: str | Path, definitions: list[MetricDefinition] | None = None,
             fmt: str | None = None, job_id: str | None = None,
             run: str | None = None, sessions: bool = True) -> Job:
    """Read one training run. ``definitions`` apply to text logs (default:
    ``DEFAULT_DEFINITIONS``); ``fmt`` skips detection; ``job_id`` names the job (default:
    the file's stem, or the MLflow run id); ``run`` picks a run in an MLflow store by id or
    name (default: the most recent); ``sessions=False`` keeps the records a later session
    of the run rewrote (``sessions.py``), for a tool that cuts the file's records itself."""
    if fmt is None:
        fmt = detect_format(path)
    reader = FORMATS.get(fmt)
    if reader is None:
        raise FormatError(path, f"unknown format {fmt!r} (known: {', '.join(sorted(FORMATS))})")
    job = reader.read(path, definitions, run=run, sessions=sessions)
    if job_id:
        job.id = job_id
    return job


def load_runs(path: str | Path, definitions: list[MetricDefinition] | None = None,
              fmt: str | None = None) -> list[Found]:
    """Every run in ``path``: one for a log file; one per run for an MLflow store and a
    TensorBoard log dir. Ids are not yet unique across paths: see ``assign_ids``."""
    if fmt is None:
        fmt = detect_format(path)
    reader = FORMATS.get(fmt)
    if reader is None:
        raise FormatError(path, f"unknown format {fmt!r} (known: {', '.join(sorted(FORMATS))})")
    return reader.read_all(path, definitions)


def assign_ids(found: list[Found]) -> None:
    """Give every run an id that tells it from the others: its name in its store
    (``experiment/run``) or its path's nearest distinguishing parts."""
    parts = [run_parts(f.path) + ([f.label] if f.label else []) for f in found]
    for f, id_ in zip(found, distinguishing_ids(parts), strict=True):
        f.job.id = id_


__all__ = [
    "DEFAULT_DEFINITIONS", "FORMATS", "FormatError", "Found", "MetricDefinition", "Reader",
    "assign_ids", "detect_format", "load_definitions", "load_run", "load_runs",
    "parse_metric_option",
]
