"""The CI examples in docs/ci: valid against GitHub's and GitLab's published schemas
(check-jsonschema's vendored copies, offline), and every ``trainguard gate`` line in them
is one the CLI accepts, with the exit codes the gate documents."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from trainguard import gate as gate_module
from trainguard.cli import app

CI = Path(__file__).resolve().parents[1] / "docs" / "ci"
FILES = {"github-actions.yml": "vendor.github-workflows", "gitlab-ci.yml": "vendor.gitlab-ci"}


def check_jsonschema() -> str:
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name(
        "check-jsonschema"))
    if not Path(exe).exists():
        pytest.skip("check-jsonschema is not installed (pip install check-jsonschema)")
    return exe


@pytest.mark.parametrize(("name", "schema"), sorted(FILES.items()))
def test_ci_files_are_valid_against_their_published_schemas(name: str, schema: str) -> None:
    done = subprocess.run([check_jsonschema(), "--builtin-schema", schema, str(CI / name)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_can_fail(tmp_path: Path) -> None:
    bad = yaml.safe_load((CI / "github-actions.yml").read_text())
    bad["jobs"]["train"]["runs-on"] = {"labels": 7}
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(bad))
    done = subprocess.run([check_jsonschema(), "--builtin-schema", FILES["github-actions.yml"],
                           str(path)], capture_output=True, text=True, check=False)
    assert done.returncode != 0


def scripts(name: str) -> list[str]:
    data: Any = yaml.safe_load((CI / name).read_text())
    out: list[str] = []
    jobs = data["jobs"].values() if "jobs" in data else [
        v for v in data.values() if isinstance(v, dict) and "script" in v]
    for job in jobs:
        for step in job.get("steps", []):
            out.append(step.get("run", ""))
        out += [s for s in job.get("script", [])]
    return out


def gate_lines(name: str) -> list[list[str]]:
    lines = []
    for text in scripts(name):
        joined = text.replace("\\\n", " ")
        for m in re.finditer(r"trainguard gate [^\n]*", joined):
            lines.append(shlex.split(m.group(0))[2:])
    return lines


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_gate_line_is_one_the_cli_accepts(name: str, monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """The options parse and pass the command's checks. No cloud or cluster is here: the
    source and the gate's loop are stood in for (the boundary), so what is tested is the
    command line itself."""
    lines = gate_lines(name)
    assert lines, f"no trainguard gate line in {name}"
    seen: list[Any] = []

    def run_gate(source: Any, policy: Any, spec: Any, console: Any) -> gate_module.GateResult:
        seen.append(spec)
        return gate_module.GateResult("pass", "", source.ref)

    monkeypatch.setattr("trainguard.gate_cmd.run_gate", run_gate)
    monkeypatch.setattr("trainguard.gate_cmd.provider_source",
                        lambda source, ref, opts, deadline: gate_module.GateSource(
                            source, lambda now: None, lambda j, r: None, ref, deadline))
    monkeypatch.chdir(tmp_path)  # the lines write gate.json where they run
    prior = tmp_path / "prior.json"
    prior.write_text("{}")
    # what the CI expands before the shell runs the line
    variables = {**yaml.safe_load((CI / name).read_text()).get("variables", {}),
                 "${{ inputs.target }}": "val_loss<=0.35", "training/prior.json": str(prior)}
    for args in lines:
        for key, value in variables.items():
            args = [a.replace(key if key.startswith(("$", "training")) else f"${key}", value)
                    for a in args]
        result = CliRunner().invoke(app, ["gate", *args])
        assert result.exit_code == gate_module.PASS, (args, result.output)
    assert len(seen) == len(lines)
    assert all(s.until in ("done", "deadline") for s in seen)


def test_gitlab_lets_a_cancel_through_and_nothing_else() -> None:
    data = yaml.safe_load((CI / "gitlab-ci.yml").read_text())
    assert data["train-and-gate"]["allow_failure"] == {"exit_codes": [gate_module.CANCELLED]}


def test_the_exit_codes_the_files_state_are_the_gates() -> None:
    text = (CI / "github-actions.yml").read_text()
    for verdict, code in gate_module.EXIT_CODES.items():
        assert re.search(rf"#\s+{code} {verdict}\b", text), (verdict, code)
