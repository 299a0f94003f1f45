"""What the CLI's commands share: the consoles, the one way to fail on bad input, the
policy loader and the search for run files. Its own module so that the command modules
(``gate_cmd``, ``prices_cmd``, ``prior_cmd``, ...) and ``cli``, which registers them, do not
import each other.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

from trainguard.checker.policy import Policy

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False)


def fail(message: str) -> NoReturn:
    """Report bad input, one line per problem (a policy may have several), and exit 2."""
    for line in message.splitlines() or [""]:
        typer.echo(f"trainguard: error: {line}", err=True)  # never wrapped: one line each
    raise typer.Exit(2)


@contextmanager
def bad_input() -> Iterator[None]:
    """Turn the errors of reading user input into one line and exit code 2."""
    from trainguard.adapters.local.errors import FormatError
    from trainguard.config import PolicyError

    try:
        yield
    except (FormatError, PolicyError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{e.filename or ''}: {e.strerror or e}")
    except UnicodeDecodeError as e:
        fail(f"not a text file ({e.reason})")


def load_policy(path: Path | None) -> Policy:
    from trainguard.config import runtime_policy

    with bad_input():
        # Run on this machine, a policy answers to no deployment switch: its own dry_run
        # decides (the same loader as the deployed runtimes, with the switch on).
        return runtime_policy(path, stop_enabled=True)


def _recognised(path: Path) -> bool:
    from trainguard.adapters.local import FORMATS

    return any(reader.sniff(path) for reader in FORMATS.values())


def local_files(path: Path) -> list[Path]:
    """A file as given; a folder searched for what some reader recognises. A folder that is
    itself a run (a TensorBoard log dir, an MLflow store) counts once and is not entered."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        fail(f"{path}: no such file or folder")
    if _recognised(path):
        return [path]
    found: list[Path] = []
    for top, dirs, files in os.walk(path):
        dirs.sort()
        for d in list(dirs):
            sub = Path(top, d)
            if d.startswith(".") or _recognised(sub):
                dirs.remove(d)
                if not d.startswith("."):
                    found.append(sub)
        found += [Path(top, f) for f in sorted(files)
                  if not f.startswith(".") and _recognised(Path(top, f))]
    return sorted(found, key=_natural)


def _natural(path: Path) -> list[Any]:
    """version_2 before version_10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(path))]
