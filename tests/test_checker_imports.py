"""``checker`` runs inside every watchdog function: it must import with numpy and the
standard library alone. A fresh interpreter refuses every other third-party module and
imports every module of the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import importlib, pkgutil, sys

ALLOWED = set(sys.stdlib_module_names) | {"numpy", "_distutils_hack"}
OURS = ("trainguard", "trainguard.checker")  # the package itself, and the checker under it

class Refuse:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top == "trainguard":
            if name not in OURS and not name.startswith("trainguard.checker."):
                raise ImportError(f"checker imported {name!r}: only numpy and the stdlib may be")
        elif top not in ALLOWED and not top.startswith("_"):
            raise ImportError(f"checker imported {name!r}: only numpy and the stdlib may be")
        return None

sys.meta_path.insert(0, Refuse())
import trainguard.checker
names = [m.name for m in pkgutil.walk_packages(trainguard.checker.__path__,
                                               "trainguard.checker.")]
for name in names:
    importlib.import_module(name)
import trainguard.checker.rules
from trainguard.checker.registry import rule_names
print(len(names), ",".join(rule_names()))
"""


def test_checker_imports_with_numpy_and_the_stdlib_alone() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    modules, rules = done.stdout.split()
    assert int(modules) >= 15
    assert set(rules.split(",")) >= {"stall", "divergence", "plateau", "utilization",
                                     "restarts", "budget", "logs", "target"}
