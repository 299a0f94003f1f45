"""``trainguard prior learn`` writes a policy snippet the target rule uses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from trainguard.checker import Job, Series, Severity, evaluate
from trainguard.cli import app
from trainguard.config import load_policy_text


def write_run(path: Path, final: float, planned: int = 1000, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    lines = []
    for step in range(0, planned + 1, 50):
        x = max(step / planned, 0.01)
        v = final + 2.0 * (x ** -0.5 - 1) / 9 + rng.normal(0, 0.003)
        lines.append(f"step:{step}/{planned} val_loss:{v:.4f} train_time:{step * 100}ms")
    path.write_text("\n".join(lines) + "\n")


def test_learnt_prior_loads_as_policy_and_drives_the_target_rule(tmp_path: Path) -> None:
    for g in range(4):
        for seed in range(3):
            d = tmp_path / "runs" / f"config{g}"
            d.mkdir(parents=True, exist_ok=True)
            write_run(d / f"seed{seed}.log", final=3.2 + 0.01 * g, seed=10 * g + seed)
    out = tmp_path / "prior.yaml"
    res = CliRunner().invoke(app, ["prior", "learn", str(tmp_path / "runs"),
                                   "--target", "3.28", "--out", str(out)])
    assert res.exit_code == 0, res.output
    policy = load_policy_text(out.read_text(), str(out))
    assert policy.rules["target"].params["target"] == 3.28

    # A run of the same recipe heading for 3.6 is a confident miss at 30 % of its steps.
    step = np.arange(0, 301, 50, dtype=float)
    value = 3.6 + 2.0 * (np.maximum(step / 1000, 0.01) ** -0.5 - 1) / 9
    job = Job(id="late", clock="step", planned_steps=1000,
              series={"val_loss": Series("val_loss", step, step, value)})
    (f,) = [f for f in evaluate([job], policy, 300.0) if f.rule == "target"]
    assert f.severity is Severity.WARNING and f.evidence["prior"] is True


def test_too_few_runs_is_a_clear_error(tmp_path: Path) -> None:
    write_run(tmp_path / "only.log", final=3.2)
    res = CliRunner().invoke(app, ["prior", "learn", str(tmp_path / "only.log")])
    assert res.exit_code == 2
    assert "at least 4 past runs" in res.output and "Traceback" not in res.output
