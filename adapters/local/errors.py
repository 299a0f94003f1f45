"""The one error every local reader raises on bad input."""

from __future__ import annotations

from pathlib import Path


class FormatError(ValueError):
    """A file that cannot be read as the format it claims to be.

    The message names the file, the line (where there is one) and the reason, e.g.
    ``runs/a.csv:17: column 'loss': cannot read 'abc' as a number``.
    """

    def __init__(self, path: str | Path, reason: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {reason}")
