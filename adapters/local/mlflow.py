"""MLflow tracking stores, read with the standard library (no mlflow at run time).

- File store: ``mlruns/<experiment>/<run>/metrics/<name>`` with lines
  ``timestamp_ms value step`` and ``meta.yaml`` holding status, start_time, end_time and
  run_name. The path may be the ``mlruns`` folder, one experiment or one run.
- SQLite store (``mlflow.db``): tables ``runs``, ``metrics`` and ``tags``. MLflow keeps a
  NaN as value 0 with ``is_nan`` set, and an infinity as the largest float; both are
  turned back into NaN and inf here.

``read_all`` gives every active run of the store, named ``experiment/run name``; ``read``
(``load_run``) the one named by ``run`` (its id or its name), else the most recent.
"""

from __future__ import annotations

import math
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.adapters.local.base import Found, Reader, RunBuilder, open_text
from trainguard.adapters.local.definitions import MetricDefinition
from trainguard.adapters.local.errors import FormatError
from trainguard.checker.model import JobState

# the file store writes RunStatus numbers, the SQL store their names
_STATUS_NAMES = {1: "RUNNING", 2: "SCHEDULED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}
STATES = {"RUNNING": JobState.RUNNING, "SCHEDULED": JobState.PENDING,
          "FINISHED": JobState.SUCCEEDED, "FAILED": JobState.FAILED, "KILLED": JobState.STOPPED}
_SQLITE_MAGIC = b"SQLite format 3\x00"
_FLOAT_MAX = sys.float_info.max


@dataclass
class RunInfo:
    run_id: str
    name: str
    status: str
    start_ms: float | None
    end_ms: float | None
    where: Path  # the run folder (file store) or the database
    tags: dict[str, str] = field(default_factory=dict)
    experiment: str = ""  # the experiment's name (its id when it has none)


def _status(value: Any) -> str:
    if isinstance(value, int):
        return _STATUS_NAMES.get(value, str(value))
    return str(value or "")


def _ms(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == _SQLITE_MAGIC
    except OSError:
        return False


def _pick(runs: list[RunInfo], select: str | None, path: Path) -> RunInfo:
    if not runs:
        raise FormatError(path, "no MLflow runs in this store")
    if select is not None:
        for r in runs:
            if select in (r.run_id, r.name):
                return r
        known = ", ".join(f"{r.run_id} ({r.name})" for r in runs[:10])
        raise FormatError(path, f"no MLflow run {select!r}; runs here: {known}")
    return max(runs, key=lambda r: (r.start_ms or 0.0, r.run_id))


class _FileStore:
    @staticmethod
    def meta(path: Path) -> dict[str, Any]:
        import yaml

        try:
            with open_text(path) as f:
                doc = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise FormatError(path, f"not valid YAML: {e}") from None
        return doc if isinstance(doc, dict) else {}

    @classmethod
    def runs(cls, root: Path) -> list[RunInfo]:
        """Every active run under ``root``: a run folder, an experiment or the store."""
        if (root / "metrics").is_dir() and (root / "meta.yaml").is_file():
            candidates = [root]
        elif (root / "meta.yaml").is_file():
            candidates = [p for p in root.iterdir() if (p / "meta.yaml").is_file()]
        else:
            if (root / "mlruns").is_dir():
                root = root / "mlruns"
            candidates = [run for exp in root.iterdir() if exp.is_dir() and
                          not exp.name.startswith(".") for run in exp.iterdir()
                          if (run / "meta.yaml").is_file() and (run / "metrics").is_dir()]
        out = []
        for run in candidates:
            exp_meta = run.parent / "meta.yaml"
            experiment = str((cls.meta(exp_meta) if exp_meta.is_file() else {}).get("name")
                             or run.parent.name)
            meta = cls.meta(run / "meta.yaml")
            if meta.get("lifecycle_stage", "active") != "active":
                continue
            tags = {t.relative_to(run / "tags").as_posix():
                    t.read_text(encoding="utf-8", errors="replace")
                    for t in (run / "tags").rglob("*") if t.is_file()}
            out.append(RunInfo(str(meta.get("run_id") or run.name),
                               str(meta.get("run_name") or tags.get("mlflow.runName", "")),
                               _status(meta.get("status")), _ms(meta.get("start_time")),
                               _ms(meta.get("end_time")), run, tags, experiment))
        return out

    @staticmethod
    def metrics(info: RunInfo, run: RunBuilder) -> None:
        folder = info.where / "metrics"
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            name = file.relative_to(folder).as_posix()
            with open_text(file) as f:
                for lineno, line in enumerate(f, 1):
                    parts = line.split()
                    if not parts:
                        continue
                    try:
                        ts, value = float(parts[0]), float(parts[1])
                        step = float(parts[2]) if len(parts) > 2 else 0.0
                    except (ValueError, IndexError):
                        raise FormatError(file, f"metric {name!r}: expected 'timestamp value "
                                          f"step', found {line.strip()!r}", lineno) from None
                    run.add(name, value, step, ts / 1000.0, row=lineno)


class _SqlStore:
    @staticmethod
    def connect(path: Path) -> sqlite3.Connection:
        try:
            return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        except sqlite3.Error as e:
            raise FormatError(path, f"cannot open the MLflow database: {e}") from None

    @staticmethod
    def runs(db: sqlite3.Connection, path: Path) -> list[RunInfo]:
        names = {str(k): str(v or k) for k, v in db.execute(
            "SELECT experiment_id, name FROM experiments")}
        rows = db.execute("SELECT run_uuid, name, status, start_time, end_time, experiment_id "
                          "FROM runs WHERE lifecycle_stage IS NULL OR lifecycle_stage = 'active'")
        return [RunInfo(str(r[0]), str(r[1] or ""), _status(r[2]), _ms(r[3]), _ms(r[4]), path,
                        experiment=names.get(str(r[5]), str(r[5]))) for r in rows]

    @staticmethod
    def metrics(db: sqlite3.Connection, info: RunInfo, run: RunBuilder) -> None:
        rows = db.execute('SELECT "key", value, timestamp, step, is_nan FROM metrics '
                          "WHERE run_uuid = ? ORDER BY timestamp, step", (info.run_id,))
        for row, (key, value, ts, step, is_nan) in enumerate(rows, 1):
            v = float(value)
            if is_nan:
                v = math.nan
            elif abs(v) >= _FLOAT_MAX:
                v = math.copysign(math.inf, v)  # how MLflow stores an infinity
            run.add(str(key), v, float(step), float(ts) / 1000.0, row=row)
        info.tags = {str(k): str(v) for k, v in db.execute(
            'SELECT "key", value FROM tags WHERE run_uuid = ?', (info.run_id,))}


class MlflowReader(Reader):
    name = "mlflow"

    def matches_name(self, path: Path) -> bool:
        if path.is_dir():
            return path.name == "mlruns" or (path / "mlruns").is_dir() or (
                (path / "meta.yaml").is_file() and not (path / "trainer_state.json").exists())
        return path.suffix in (".db", ".sqlite", ".sqlite3") and _is_sqlite(path)

    def matches_content(self, path: Path) -> bool:
        return path.is_file() and _is_sqlite(path)

    def default_id(self, path: Path) -> str:
        return path.name

    def _store(self, path: Path) -> Path:
        if path.is_dir() and (path / "mlflow.db").is_file() and not (path / "mlruns").is_dir():
            return path / "mlflow.db"
        return path

    def _each(self, path: Path, select: str | None, every: bool,
              fill: Any) -> list[RunInfo]:
        """The runs of the store (every one, or the one picked), each read into
        ``fill(info)``'s builder."""
        if path.is_file():
            db = _SqlStore.connect(path)
            try:
                runs = _SqlStore.runs(db, path)
                if not runs:
                    raise FormatError(path, "no MLflow runs in this store")
                picked = runs if every else [_pick(runs, select, path)]
                for info in picked:
                    _SqlStore.metrics(db, info, fill(info))
            except sqlite3.Error as e:
                raise FormatError(path, f"not an MLflow database: {e}") from None
            finally:
                db.close()
        else:
            runs = _FileStore.runs(path)
            if not runs:
                raise FormatError(path, "no MLflow runs in this store")
            picked = runs if every else [_pick(runs, select, path)]
            for info in picked:
                _FileStore.metrics(info, fill(info))
        return picked

    def read_all(self, path: str | Path, definitions: list[MetricDefinition] | None = None
                 ) -> list[Found]:
        """Every active run, oldest first, named ``experiment/run name`` (with the start of
        its run id where two runs of one experiment share a name)."""
        p = Path(path)
        if not p.exists():
            raise FormatError(p, "no such file or directory")
        store = self._store(p)
        builders: dict[str, RunBuilder] = {}

        def fill(info: RunInfo) -> RunBuilder:
            builders[info.run_id] = RunBuilder(p)
            return builders[info.run_id]

        runs = sorted(self._each(store, None, True, fill),
                      key=lambda r: (r.start_ms or 0.0, r.run_id))
        labels = [f"{r.experiment}/{r.name or r.run_id}" for r in runs]
        out = []
        for info, label in zip(runs, labels, strict=True):
            if labels.count(label) > 1:
                label = f"{label}-{info.run_id[:8]}"
            b = builders[info.run_id]
            _describe(b, info)
            out.append(Found(p, label, b.build(info.run_id),
                             aliases=(info.run_id, info.name, label)))
        return out

    def collect(self, path: Path, run: RunBuilder, definitions: list[MetricDefinition] | None,
                select: str | None) -> None:
        infos = self._each(self._store(path), select, False, lambda info: run)
        _describe(run, infos[0])


def _describe(run: RunBuilder, info: RunInfo) -> None:
    """The run's name, state, tags and times from the store's own record of it."""
    run.id = info.run_id
    run.name = info.name or info.run_id
    run.raw_state = info.status
    run.state = STATES.get(info.status, JobState.UNKNOWN)
    run.tags = {k: v for k, v in info.tags.items() if not k.startswith("mlflow.")}
    if info.start_ms is not None:
        run.start_time = info.start_ms / 1000.0
    if info.end_ms is not None and run.state.terminal:
        run.end_time = info.end_ms / 1000.0
