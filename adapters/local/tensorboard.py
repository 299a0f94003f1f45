"""TensorBoard event files (``events.out.tfevents.*``, or a folder holding them), read with
the ``tensorboard`` package's own event loader: every scalar with its wall time and step."""

from __future__ import annotations

import gzip
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from adapters.local.base import Reader, RunBuilder, is_gzip, plain_name
from adapters.local.definitions import MetricDefinition
from adapters.local.errors import FormatError

_PREFIX = "events.out.tfevents."


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

    def default_id(self, path: Path) -> str:
        return path.name if path.is_dir() else path.parent.name or path.name

    def collect(self, path: Path, run: RunBuilder, definitions: list[MetricDefinition] | None,
                select: str | None) -> None:
        event_file_loader, tensor_util = _loader(path)
        scalar_tags: dict[str, bool] = {}  # v2 summaries carry their metadata once per tag
        row = 0
        for file in event_files(path):
            prefix = ""
            if path.is_dir() and file.parent != path:
                prefix = file.parent.relative_to(path).as_posix() + "/"  # one run per subfolder
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
