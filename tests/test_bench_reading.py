"""The two measurement scripts of this session, on runs built in the test:
``bench/default_reading.py`` (a labelled text log read with and without its
definitions) and ``bench/rl_never_rose.py`` (the rise of an RL reward in noise units)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests import bench_scripts

READING = bench_scripts.load("default_reading")
NEVER = bench_scripts.load("rl_never_rose")


def _labels(tmp_path: Path, line: str, metrics: str) -> Path:
    (tmp_path / "text").mkdir()
    rows = "".join(line.format(step=s, loss=2.0 / s) + "\n" for s in range(1, 60))
    (tmp_path / "text" / "run.log").write_text(rows)
    labels = tmp_path / "labels.csv"
    labels.write_text("run,label,format,metrics\n"
                      f'text/run.log,healthy,text,"{metrics}"\n')
    return labels


def test_a_log_the_defaults_read_as_its_definitions_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = _labels(tmp_path, "iter: {step}  total_loss: {loss:.4f}",
                     r"step=iter: (\d+);loss=total_loss: ([-+0-9.eE]+)")
    monkeypatch.setattr(sys, "argv", ["default_reading.py", str(labels)])
    assert READING.main() == 0
    out = capsys.readouterr().out
    assert "loss read by default: same 1" in out
    assert "| healthy or spiky | quiet | quiet | 1 |" in out


def test_a_log_the_defaults_cannot_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = _labels(tmp_path, "#{step} -> {loss:.4f}", r"step=#(\d+);loss=-> ([-+0-9.eE]+)")
    monkeypatch.setattr(sys, "argv", ["default_reading.py", str(labels)])
    assert READING.main() == 0
    assert "loss read by default: none 1" in capsys.readouterr().out


def test_the_rise_of_a_reward_in_its_noise_units() -> None:
    rng = np.random.default_rng(0)
    flat = 10.0 + rng.normal(0.0, 1.0, 500)
    rising = np.linspace(0.0, 50.0, 500) + rng.normal(0.0, 1.0, 500)
    assert abs(NEVER.rise(flat)) < 1.0
    assert NEVER.rise(rising) > 20.0
