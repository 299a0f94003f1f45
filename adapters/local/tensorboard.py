"""TensorBoard event files (``events.out.tfevents.*``, or a folder holding them), read with
the ``tensorboard`` package's own event loader: every scalar with its wall time and step.

A log dir holds runs as TensorBoard shows them: each folder with event files is a run,
except the parts of one run that writers split into subfolders (Keras's ``train/`` and
``validation/``, PyTorch ``add_scalars``'s ``Loss_train/`` beside the run's own events),
which join the run above them with their folder as a tag prefix (``validation/epoch_loss``).
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainguard.adapters.local.base import Found, Reader, RunBuilder, is_gzip, plain_name
from trainguard.adapters.local.definitions import MetricDefinition
from trainguard.adapters.local.errors import FormatError

_PREFIX = "events.out.tfevents."


#: subfolders that hold one part of a run (Keras's TensorBoard callback writes these)
PART_FOLDERS = frozenset({"train", "training", "validation", "val", "valid", "eval", "test"})


def runs_in(root: Path) -> dict[Path, list[Path]]:
    """The runs of a log dir: run folder -> its event files (its parts' files included)."""
    files = event_files(root)
    holders = {f.parent for f in files}

    def owner(folder: Path) -> Path:
        while folder != root and (folder.name.lower() in PART_FOLDERS
                                  or folder.parent in holders):
            folder = folder.parent
        return folder

    runs: dict[Path, list[Path]] = {}
    for f in files:
        runs.setdefault(owner(f.parent), []).append(f)
    return runs


def event_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob(_PREFIX + "*") if p.is_file())


@contextmanager
def _plain(path: Path) -> Iterator[Path]:
    """The event loader reads plain files only: a .gz is unpacked to a temporary copy."""
    if not is_gzip(path):
        yield path
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / plain_name(path)
        try:
            with gzip.open(path, "rb") as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
        except (OSError, EOFError) as e:
            raise FormatError(path, f"compressed file is damaged or cut short: {e}") from None
        yield out


def _loader(path: Path) -> Any:
    try:
        from tensorboard.backend.event_processing import event_file_loader
        from tensorboard.util import tensor_util
    except ImportError:
        raise FormatError(path, "reading TensorBoard event files needs the "
                          "'tensorboard' package: pip install 'trainguard[formats]'") from None
    return event_file_loader, tensor_util


class TensorBoardReader(Reader):
    name = "tensorboard"

    def matches_name(self, path: Path) -> bool:
        if path.is_dir():
            return any(True for _ in path.rglob(_PREFIX + "*"))
        return plain_name(path).startswith(_PREFIX)

    def sniff(self, path: str | Path) -> bool:
        """When a folder is searched, a folder is a run only if it holds event files (or
        its Keras ``train/``/``validation/`` parts do): a folder of runs is entered, so the
        other runs beside them (a CSV, a log) are found too."""
        p = Path(path)
        if not p.is_dir():
            return self.matches_name(p)
        return any(p.glob(_PREFIX + "*")) or any(
            any(part.glob(_PREFIX + "*")) for part in p.iterdir()
            if part.is_dir() and part.name.lower() in PART_FOLDERS)

    def default_id(self, path: Path) -> str:
        return path.name if path.is_dir() else path.parent.name or path.name

    def read_all(self, path: str | Path, definitions: list[MetricDefinition] | None = None
                 ) -> list[Found]:
        """One run per run folder of a log dir (see ``runs_in``)."""
        p = Path(path)
        if not p.is_dir():
            return super().read_all(p, definitions)
        out = []
        for folder, files in sorted(runs_in(p).items()):
            builder = RunBuilder(folder)
            self._collect(folder, files, builder)
            out.append(Found(folder, None, builder.build(self.default_id(folder))))
        return out

    def collect(self, path: Path, run: RunBuilder, definitions: list[MetricDefinition] | None,
                select: str | None) -> None:
        self._collect(path, event_files(path), run)

    def _collect(self, path: Path, files: list[Path], run: RunBuilder) -> None:
        event_file_loader, tensor_util = _loader(path)
        scalar_tags: dict[str, bool] = {}  # v2 summaries carry their metadata once per tag
        row = 0
        for file in files:
            prefix = ""
            if path.is_dir() and file.parent != path:
                prefix = file.parent.relative_to(path).as_posix() + "/"  # a part of the run
            with _plain(file) as plain:
                try:
                    events = list(event_file_loader.EventFileLoader(str(plain)).Load())
                except Exception as e:  # the loader's protobuf errors have no common base
                    raise FormatError(file, f"not a readable TensorBoard event file: {e}") \
                        from None
            # the loader stops quietly at a damaged record (it may be one being written),
            # but a file that starts with one holds no events at all
            if not events and file.stat().st_size > 0:
                raise FormatError(file, "not a readable TensorBoard event file: its first "
                                  "record is damaged")
            for event in events:
                row += 1
                if not event.HasField("summary"):
                    continue
                for value in event.summary.value:
                    plugin = value.metadata.plugin_data.plugin_name
                    if plugin:
                        scalar_tags[value.tag] = plugin == "scalars"
                    if not scalar_tags.get(value.tag, False):
                        continue
                    number = tensor_util.make_ndarray(value.tensor)
                    if number.size != 1:
                        continue
                    run.add(prefix + value.tag, float(number.reshape(-1)[0]),
                            float(event.step), float(event.wall_time), row=row)
