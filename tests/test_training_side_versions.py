"""The training side (``trainguard.emit``, ``trainguard.callbacks``, ``trainguard.launch``)
installs and works on Python 3.9 to 3.13 (issue 14): on each Python that pyenv holds,
the session's wheel goes into a fresh venv with that Python's own bundled pip and no
package index, a training script writes records with ``trainguard.emit`` and uses the
callbacks' helpers and the launch helpers, and the tool in this venv judges the records.
On 3.9 and 3.10 the wheel installs nothing else, and the ``trainguard`` command says in
one line that it needs 3.11.

The callback modules' frameworks (transformers, Lightning) are not installed on these
venvs (they would take minutes): there the callback modules are only compiled; their
behaviour on real trainings is tests/test_callbacks.py's, on this venv's Python. The
Azure ML and SageMaker launch helpers get plain objects with the attributes the SDKs'
jobs have, the SDKs being absent there too (tests/test_launch.py uses the real SDKs).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.wheel_build import ROOT, wheel
from trainguard.cli import app
from trainguard.launch import azureml, kubeflow
from trainguard.launch import sagemaker as sm

MINORS = (9, 10, 11, 12, 13)  # the training side's Pythons
TOOL_FROM = (3, 11)  # the tool's oldest Python
NAN_STEP = 250  # where the training script's loss goes NaN


def pyenv_root() -> Path | None:
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    return Path(root) if (Path(root) / "versions").is_dir() else None


def interpreter(minor: int) -> Path | None:
    """The newest 3.<minor>.x under pyenv's versions, if any."""
    root = pyenv_root()
    if root is None:
        return None
    found = []
    for path in (root / "versions").glob(f"3.{minor}.*/bin/python3.{minor}"):
        patch = path.parent.parent.name.split(".")[2]
        if patch.isdigit():
            found.append((int(patch), path))
    return max(found)[1] if found else None


def bundled_pip(python: Path, minor: int) -> Path | None:
    """The pip wheel that Python ships for ensurepip: runs on that Python (this venv's
    pip may not: pip 26 needs 3.10)."""
    wheels = sorted((python.parent.parent / "lib" / f"python3.{minor}" / "ensurepip" /
                     "_bundled").glob("pip-*.whl"))
    return wheels[-1] if wheels else None


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheel(tmp_path_factory.mktemp("wheel"))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(args: list[Any], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout, check=False)


def install(python: Path, minor: int, built: Path, where: Path) -> Path:
    """A fresh venv of ``python`` with the wheel installed from the file alone."""
    pip = bundled_pip(python, minor)
    if pip is None:
        pytest.skip(f"Python 3.{minor} under pyenv has no bundled pip (ensurepip) to install with")
    made = _run([python, "-m", "venv", "--without-pip", where], cwd=where.parent)
    assert made.returncode == 0, made.stderr
    venv_python = where / "bin" / "python"
    # --no-index: nothing may come from a registry. Below 3.11 no --no-deps either: the
    # tool's dependencies are marked python_version >= "3.11", so there are none to get.
    # From 3.11 on a training image takes the package alone (README, Installing).
    extra = ["--no-deps"] if (3, minor) >= TOOL_FROM else []
    done = _run([venv_python, pip / "pip", "install", "-q", "--no-index",
                 "--disable-pip-version-check", *extra, built], cwd=where.parent, timeout=180)
    assert done.returncode == 0, f"pip install on 3.{minor}: {done.stdout}{done.stderr}"
    return venv_python


TRAINING = r"""
import json, math, py_compile, sys, types
from pathlib import Path

import time

from trainguard.emit import configure, emit, from_env, pause
from trainguard.callbacks import Phases, numbers
from trainguard.launch import azureml, kubeflow
from trainguard.launch import sagemaker as sm

log, nan_step, cb_dir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
assert from_env({"TRAINGUARD_EMIT_INTERVAL": "0"}).interval == 0
with open(log, "w") as out:
    # the module functions, as a training script calls them
    first = configure(interval=0, stream=out, total_steps=400)
    for step in range(1, 60):
        emit(step=step, loss=3.0 * math.exp(-step / 60) + 0.1, lr=1e-3)
    with pause("checkpoint", every=0.02):  # heartbeats from a thread while it runs
        paused, since = first.written, time.monotonic()
        while first.written == paused and time.monotonic() - since < 10:
            time.sleep(0.01)
    # an emitter driven as the callbacks drive it
    emitter = configure(interval=0, stream=out, total_steps=400)
    phases = Phases(emitter, every=0.05)
    for step in range(60, nan_step + 20):
        loss = 3.0 * math.exp(-step / 60) + 0.1 if step < nan_step else float("nan")
        emitter.record(step, numbers({"loss": loss, "lr": 1e-3, "note": "text is dropped"}))
        if step == 100:
            phases.begin("eval")   # pause / heartbeat / resume lines, as the callbacks write
            phases.end("eval")
            emitter.emit(step, val_loss=loss + 0.05, event="eval")

# the framework callbacks compile on this Python (their frameworks are not installed here)
for name in ("hf", "lightning"):
    py_compile.compile(str(cb_dir / (name + ".py")), cfile=log + "." + name + ".pyc",
                       doraise=True)

job = types.SimpleNamespace(tags=None, environment_variables={"A": "1"})
estimator = types.SimpleNamespace(metric_definitions=None, tags=[{"Key": "team", "Value": "x"}])
manifest = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "bert", "namespace": "ml"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": {
                "containers": [{"name": "main", "image": "train:1"}]}}}}}}
sm.watch(estimator, policy="research")
azureml.watch(job, policy="research", emit_interval=5)
print(json.dumps({
    "sagemaker": {"metric_definitions": estimator.metric_definitions, "tags": estimator.tags},
    "azureml": {"tags": job.tags, "env": job.environment_variables},
    "kubeflow": kubeflow.watch(manifest, policy="research"),
    "modules": sorted(m for m in sys.modules if m.split(".")[0] == "trainguard"),
    "file": sys.modules["trainguard"].__file__,
}))
"""


def expected_launch() -> dict[str, Any]:
    """The same launch calls on this venv's Python."""
    from types import SimpleNamespace

    job = SimpleNamespace(tags=None, environment_variables={"A": "1"})
    estimator = SimpleNamespace(metric_definitions=None, tags=[{"Key": "team", "Value": "x"}])
    manifest = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": "bert", "namespace": "ml"},
                "spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": {
                    "containers": [{"name": "main", "image": "train:1"}]}}}}}}
    sm.watch(estimator, policy="research")
    azureml.watch(job, policy="research", emit_interval=5)
    return {"sagemaker": {"metric_definitions": estimator.metric_definitions,
                          "tags": estimator.tags},
            "azureml": {"tags": job.tags, "env": job.environment_variables},
            "kubeflow": json.loads(json.dumps(kubeflow.watch(manifest, policy="research")))}


@pytest.mark.parametrize("minor", MINORS, ids=[f"py3.{m}" for m in MINORS])
def test_training_side_installs_and_its_records_are_judged(
        minor: int, built: Path, tmp_path: Path) -> None:
    if pyenv_root() is None:
        pytest.skip("pyenv not found (no PYENV_ROOT or ~/.pyenv/versions): the training "
                    "side is tested on this venv's Python only")
    python = interpreter(minor)
    if python is None:
        pytest.skip(f"Python 3.{minor} is not installed under pyenv")
    venv_python = install(python, minor, built, tmp_path / "venv")

    site = next((tmp_path / "venv" / "lib").glob("python3.*/site-packages"))
    installed = sorted(p.name for p in site.iterdir() if p.name != "__pycache__")
    if (3, minor) < TOOL_FROM:  # nothing beyond the standard library came along
        assert installed == ["trainguard", next(n for n in installed if n.endswith(
            ".dist-info"))], installed

    # -I: isolated, so neither the repository nor this venv can be on sys.path
    log = tmp_path / "train.log"
    done = _run([venv_python, "-I", "-c", TRAINING, log, NAN_STEP,
                 site / "trainguard" / "callbacks"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["file"].startswith(str(site))
    assert not [m for m in got["modules"] if m.startswith(("trainguard.adapters",
                                                          "trainguard.checker"))]
    assert {k: got[k] for k in ("sagemaker", "azureml", "kubeflow")} == expected_launch()

    # the tool, on this venv's Python, reads what that Python wrote
    result = CliRunner().invoke(app, ["check", "--format", "json", str(log)])
    assert result.exit_code == 1, result.output  # critical: the NaN
    (run,) = json.loads(result.stdout)["runs"]
    assert run["no_data"] is None
    divergence = [f for f in run["findings"] if f["rule"] == "divergence"]
    assert [(f["severity"], f["step"]) for f in divergence] == [("critical", NAN_STEP)]
    text = log.read_text()
    assert re.search(r"trainguard: pause phase=eval step=100 elapsed=0 ", text)
    assert re.search(r"trainguard: heartbeat phase=checkpoint step=59 elapsed=[0-9.]+ ", text)
    assert re.search(r"trainguard: resume phase=eval step=100 elapsed=", text)

    if (3, minor) < TOOL_FROM:
        _the_command_says_it_needs_311(venv_python, minor, tmp_path)


def _the_command_says_it_needs_311(venv_python: Path, minor: int, cwd: Path) -> None:
    script = venv_python.parent / "trainguard"
    for args in ([script, "--version"], [script, "check", "run.log"],
                 [venv_python, "-m", "trainguard.cli", "check", "run.log"],
                 [venv_python, "-m", "trainguard", "--help"]):
        done = _run(args, cwd=cwd)
        lines = done.stderr.splitlines()
        assert done.returncode == 2, (args, done.stderr)
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert lines[0].startswith("trainguard: error: the trainguard command needs Python "
                                   f"3.11 or newer, this is Python 3.{minor}."), lines[0]
        assert done.stdout == ""


def test_shipped_sagemaker_definitions_are_the_text_readers() -> None:
    """launch.sagemaker ships the reader's definitions as JSON (it runs without the
    adapters); a change to the reader's must be written there too."""
    shipped = json.loads((Path(sm.__file__).with_name(sm.DEFINITIONS_FILE)).read_text())
    assert shipped == sm.definitions_from_reader(), (
        f"trainguard/launch/{sm.DEFINITIONS_FILE} is stale: run "
        "python -m trainguard.launch.sagemaker")
    assert sm.metric_definitions() == shipped["definitions"]


def test_a_callback_module_needs_only_its_framework() -> None:
    """Importing a callback or launch module loads no other part of trainguard (not the
    checker, the adapters, the config or the CLI, nor their dependencies through them)."""
    for framework in ("transformers", "lightning"):  # found, not imported here (slow)
        if importlib.util.find_spec(framework) is None:
            pytest.skip(f"{framework} is not installed: pip install 'trainguard[train]'")
    code = ("import sys, json\n"
            "import trainguard.callbacks.hf, trainguard.callbacks.lightning\n"
            "import trainguard.launch.sagemaker, trainguard.launch.azureml, "
            "trainguard.launch.kubeflow\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('trainguard'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert [m for m in loaded if m != "trainguard"
            and m.split(".")[1] not in ("emit", "callbacks", "launch")] == []
    assert {"trainguard.callbacks.hf", "trainguard.callbacks.lightning"} <= set(loaded)
