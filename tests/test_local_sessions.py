"""Several sessions of one run in one file, written in the test as trainers write them:
Keras's ``CSVLogger(append=True)`` after a restart, ``python train.py >> train.log`` run
twice, LLaMA-Factory's ``trainer_log.jsonl`` resumed from a checkpoint; and files whose
step goes back for other reasons (MMEngine's validation records carrying the epoch, a
step counter that starts again each epoch, a Hugging Face epoch counter reset while the
step goes on, an MLflow store whose lines are not in time order), where nothing may be
set aside.

Seen on public runs: a Keras log of three appended sessions had their epoch-0 losses
(2.31, 0.86, 3.58) side by side on the step clock and got "no better than chance"; a
markdown of several GPT runs put the second run's 10.96 beside the first's 0.06.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from trainguard.adapters.local import load_run
from trainguard.cli import app

runner = CliRunner(env={"COLUMNS": "220"})


def _keras_rows(losses: list[float]) -> list[str]:
    return [f"{e},{0.1 + 0.8 * (1 - v / losses[0]):.4f},{v},{v * 1.05}"
            for e, v in enumerate(losses)]


def test_keras_restart_after_nan_judges_the_new_session(tmp_path: Path) -> None:
    """A run that went to NaN, restarted from scratch with a lower rate and appended to
    the same CSVLogger file: the new session is what runs now, so it is what is judged."""
    first = [2.3 * 0.9 ** e for e in range(12)] + [9.0, 40.0, math.nan, math.nan]
    second = [2.3 * 0.93 ** e for e in range(10)]
    path = tmp_path / "training.log"
    path.write_text("epoch,accuracy,loss,val_loss\n" + "\n".join(
        _keras_rows(first) + _keras_rows(second)) + "\n")
    job = load_run(path)
    assert job.superseded == len(first) * 3  # accuracy, loss and val_loss of session 1
    assert list(job.series["loss"].value) == second
    res = runner.invoke(app, ["check", str(path)])
    assert res.exit_code == 0, res.output
    assert "48 records set aside: a later session (restart or resume)" in res.output
    doc = json.loads(runner.invoke(app, ["check", str(path), "--format", "json"]).output)
    assert doc["runs"][0]["superseded"] == 48 and doc["runs"][0]["verdict"] == "ok"


def test_the_same_nan_without_the_restart_is_still_critical(tmp_path: Path) -> None:
    """The control: the session that went to NaN, alone, is critical."""
    first = [2.3 * 0.9 ** e for e in range(12)] + [9.0, 40.0, math.nan, math.nan]
    path = tmp_path / "training.log"
    path.write_text("epoch,accuracy,loss,val_loss\n" + "\n".join(_keras_rows(first)) + "\n")
    assert load_run(path).superseded == 0
    assert runner.invoke(app, ["check", str(path)]).exit_code == 1


def test_text_log_appended_twice_judges_the_last_run(tmp_path: Path) -> None:
    """``python train.py >> train.log``, twice: the first run converged to 0.06, the
    second starts again at 10.9. Judged together, 10.9 beside 0.06 is a many-fold climb;
    the second run alone is a run learning normally."""
    lines = []
    for session, (start, end, n) in enumerate([(10.9, 0.06, 200), (10.9, 4.0, 40)]):
        for i in range(n):
            loss = end + (start - end) * math.exp(-i / (n / 6))
            stamp = f"2024-01-0{session + 1}T10:{i // 60:02d}:{i % 60:02d}"
            lines.append(f"{stamp} step={i * 10} loss={loss:.4f}")
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    job = load_run(path)
    assert job.clock == "wall"
    assert len(job.series["loss"]) == 40 and job.series["loss"].value[0] == 10.9
    # the progress keeps both sessions: the job's start and its restart stay visible
    assert job.series["step"].step[0] == 0 and len(job.series["step"]) == 240
    assert job.start_time == job.series["step"].time[0]
    res = runner.invoke(app, ["check", str(path)])
    assert res.exit_code == 0 and "critical" not in res.output, res.output


def test_resume_from_checkpoint_keeps_the_run_up_to_it(tmp_path: Path) -> None:
    """LLaMA-Factory appends to ``trainer_log.jsonl`` when a run resumes: the steps after
    the checkpoint are logged again, and the resumed values replace the lost ones."""
    rows = [{"current_steps": s, "total_steps": 200, "loss": 2.0 - s / 1000}
            for s in range(10, 160, 10)]
    rows += [{"current_steps": s, "total_steps": 200, "loss": 1.5 - s / 1000}
             for s in range(110, 210, 10)]
    path = tmp_path / "trainer_log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = load_run(path)
    loss = job.series["loss"]
    assert list(loss.step) == list(range(10, 210, 10))  # each step once, in order
    assert loss.value[loss.step.tolist().index(100)] == 2.0 - 0.1  # before the checkpoint
    assert loss.value[loss.step.tolist().index(120)] == 1.5 - 0.12  # the resumed value
    assert job.superseded == 5  # steps 110-150 of the first session


def test_a_second_counter_in_the_same_series_is_no_session(tmp_path: Path) -> None:
    """MMEngine writes a validation record with the epoch as its step after each epoch;
    training records then go on from where they were. Nothing is rewritten."""
    rows: list[dict[str, float]] = []
    for epoch in range(1, 6):
        for it in range(1, 11):
            step = (epoch - 1) * 10 + it
            rows.append({"loss": 3.0 / step, "data_time": 0.01, "epoch": epoch,
                         "iter": step, "step": step})
        rows.append({"accuracy/top1": 50 + epoch, "data_time": 0.02, "step": epoch})
    path = tmp_path / "scalars.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = load_run(path, fmt="jsonl")
    assert job.superseded == 0
    assert len(job.series["data_time"]) == 55 and len(job.series["loss"]) == 50


def test_a_step_counter_that_restarts_each_epoch_is_no_session(tmp_path: Path) -> None:
    """``epoch=E step=S``, where S counts the batches of one epoch: every epoch starts its
    steps again, and the epoch rises with it."""
    lines = [f"epoch={e} step={s} loss={2.0 / (1 + e) + 0.01 * s:.4f}"
             for e in range(4) for s in range(0, 100, 10)]
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    job = load_run(path)
    assert job.superseded == 0 and len(job.series["loss"]) == 40


def test_an_epoch_reset_while_the_step_goes_on_is_no_session(tmp_path: Path) -> None:
    """A Hugging Face ``log_history`` whose ``epoch`` starts again at 0 (a data loader
    rebuilt on resume) while ``step`` keeps rising."""
    history = [{"step": s, "epoch": (s % 500) / 100, "loss": 3.0 / (1 + s / 100)}
               for s in range(50, 2050, 50)]
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": history, "max_steps": 2000,
                                "global_step": 2000}))
    job = load_run(path)
    assert job.superseded == 0 and len(job.series["loss"]) == 40


def test_records_out_of_time_order_in_the_file_are_no_session(tmp_path: Path) -> None:
    """On a wall clock the write order is the time order: a first record stored last (as
    an MLflow file store can hold it) is not a restart."""
    rows = [{"step": s, "timestamp": 1_700_000_000 + 30 * s, "loss": 2.0 - s / 100}
            for s in range(60)]
    rows = rows[1:] + rows[:1]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = load_run(path)
    assert job.clock == "wall" and job.superseded == 0
    assert np.array_equal(job.series["loss"].step, np.arange(60))
