"""One wheel of trainguard per test session, built the way a user builds it
(``pip wheel --no-deps``, isolated build), shared by tests/test_packaging.py and
tests/test_training_side_versions.py.

It is built from a copy of the package's sources, not in the work tree: an in-place
build leaves ``build/`` and ``*.egg-info`` behind, and setuptools never empties
``build/lib``, so a file deleted since an earlier build would still go into the wheel.
The copy keeps ``trainguard/``'s links to the layer folders as links, as in the repository.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the files at the repository's top that the build reads (pyproject's readme)
BUILD_FILES = ("pyproject.toml", "README.md")

_built: dict[str, Path] = {}


def layer_folders() -> list[str]:
    """The top-level folders linked into the package (trainguard/checker -> ../checker)."""
    return sorted(p.name for p in (ROOT / "trainguard").iterdir() if p.is_symlink())


def source_copy(dest: Path) -> Path:
    """What the build needs from the work tree, in ``dest`` (bytecode left out)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    dest.mkdir(parents=True, exist_ok=True)
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "trainguard", dest / "trainguard", symlinks=True, ignore=ignore)
    for name in layer_folders():
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    return dest


def wheel(tmp: Path) -> Path:
    """Build the wheel once per session (in ``tmp`` the first time) and return its path."""
    if "wheel" not in _built:
        src = source_copy(tmp / "src")
        out = tmp / "dist"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
            capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, f"pip wheel: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        (built,) = out.glob("trainguard-*.whl")
        _built["wheel"] = built
    return _built["wheel"]
