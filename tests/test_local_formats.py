"""trainguard.adapters.local: every format from small files the tests write, as a training
script would."""

from __future__ import annotations

import gzip
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from trainguard.adapters.local import (
    FORMATS,
    FormatError,
    MetricDefinition,
    detect_format,
    load_definitions,
    load_run,
    parse_metric_option,
)
from trainguard.adapters.local.base import MAX_LOG_LINES, parse_timestamp
from trainguard.checker.model import Job, JobState


def write(path: Path, text: str, gz: bool = False) -> Path:
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def monotone(job: Job) -> None:
    for s in job.series.values():
        assert np.all(np.diff(s.time) >= 0), s.name


# --- text ------------------------------------------------------------------------------

def speedrun_line(step: int, metric: str | None, value: str | None, ms: int, avg: str) -> str:
    """One line in the modded-nanogpt log format (made up here, not copied from a run)."""
    middle = f" {metric}:{value}" if metric else ""
    return f"step:{step}/8{middle} train_time:{ms}ms step_avg:{avg}ms"


# The timer restarts after warm-up (31500 ms, then 1500 ms): read as a counter reset.
NANOGPT = "\n".join([
    speedrun_line(0, "val_loss", "10.8258", 0, "nan"),
    speedrun_line(1, "train_loss", "10.8258", 30000, "nan"),
    speedrun_line(2, "train_loss", "9.5100", 31500, "nan"),
    speedrun_line(3, "train_loss", "8.9000", 1500, "nan"),
    speedrun_line(4, "train_loss", "nan", 3000, "1500.00"),
    speedrun_line(4, "val_loss", "8.1000", 3100, "1500.00"),
    "Traceback (most recent call last):",
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
    speedrun_line(5, None, None, 4600, "1533.33"),
]) + "\n"


@pytest.mark.parametrize("gz", [False, True])
def test_text_nanogpt_log_with_timer_reset(tmp_path: Path, gz: bool) -> None:
    path = write(tmp_path / "run-a.log", NANOGPT, gz)
    assert detect_format(path) == "text"
    job = load_run(path)
    assert job.id == "run-a" and job.provider == "local" and job.state == JobState.RUNNING
    assert job.clock == "elapsed" and job.planned_steps == 8
    train = job.series["train_loss"]
    assert list(train.step) == [1, 2, 3, 4]
    # the timer restarts after warm-up (31.5 s, then 1.5 s): time goes on from 31.5 s
    assert train.time == pytest.approx([30.0, 31.5, 33.0, 34.5])
    assert math.isnan(train.value[3])  # a NaN loss is kept, not dropped
    assert list(job.series["val_loss"].value) == [10.8258, 8.1]
    assert job.series["val_loss"].time == pytest.approx([0.0, 34.6])
    # progress: one point per distinct step, including the step with no metric
    assert list(job.series["step"].value) == [0, 1, 2, 3, 4, 5]
    assert job.series["step"].time[-1] == pytest.approx(36.1)
    # lines no definition matches are kept for the logs rule, on the job's clock
    assert [line.text for line in job.logs] == [
        "Traceback (most recent call last):",
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ]
    assert [line.time for line in job.logs] == pytest.approx([34.6, 34.6])
    assert job.start_time == 0.0
    monotone(job)


def test_text_train_time_in_seconds(tmp_path: Path) -> None:
    path = write(tmp_path / "s.log", "step:0/2 val_loss:4.0 train_time:0.000s\n"
                 "step:1/2 train_loss:3.5 train_time:492.485s\n")
    job = load_run(path)
    assert job.clock == "elapsed"
    assert job.series["train_loss"].time == pytest.approx([492.485])


def test_text_timestamps_and_generic_key_values(tmp_path: Path) -> None:
    path = write(tmp_path / "train.log", (
        "2024-05-01T10:00:00Z starting run\n"
        "2024-05-01T10:00:05Z step=1 loss=2.50 lr=1e-3\n"
        "2024-05-01T10:00:10Z step=2 loss=2.25 lr=1e-3\n"
        "[2024-05-01 10:00:15,500+00:00] Epoch: 1 val_loss: 2.4\n"
        "2024-05-01T10:00:20Z step=3 loss=inf\n"))
    job = load_run(path)
    t0 = parse_timestamp("2024-05-01T10:00:00+00:00")
    assert job.clock == "wall"
    loss = job.series["loss"]
    assert loss.time - t0 == pytest.approx([5, 10, 20])
    assert math.isinf(loss.value[-1])
    assert list(job.series["lr"].value) == [1e-3, 1e-3]
    assert job.series["val_loss"].time - t0 == pytest.approx([15.5])
    assert job.series["epoch"].value[0] == 1
    assert [line.text for line in job.logs] == ["2024-05-01T10:00:00Z starting run"]
    assert job.start_time == pytest.approx(t0)
    assert "train_loss" not in job.series  # "loss" does not match inside other names


def test_one_banner_timestamp_does_not_hide_the_time_field(tmp_path: Path) -> None:
    path = write(tmp_path / "b.log", "2024-05-01 10:00:00 launching on 8 GPUs\n" + NANOGPT)
    job = load_run(path)
    assert job.clock == "elapsed"
    assert job.series["train_loss"].time == pytest.approx([30.0, 31.5, 33.0, 34.5])


def test_text_without_time_uses_the_step_clock(tmp_path: Path) -> None:
    job = load_run(write(tmp_path / "plain.txt", "step: 10 loss: 1.0\nstep: 20 loss: 0.5\n"))
    assert job.clock == "step"
    assert list(job.series["loss"].time) == [10, 20]


def test_text_with_user_definitions(tmp_path: Path) -> None:
    path = write(tmp_path / "custom.out", "it 5 | acc 0.50 | t 2000\nit 6 | acc 0.75 | t 3000\n"
                 "it 7 | acc ?? | t 4000\n")
    defs = [parse_metric_option(r"step=it (\d+)"),
            parse_metric_option(r"accuracy=acc ([0-9.]+)"),
            parse_metric_option(r"t,time,scale:0.001=\| t (\d+)")]
    job = load_run(path, defs)
    assert job.clock == "elapsed"
    assert list(job.series["accuracy"].value) == [0.5, 0.75]
    assert list(job.series["accuracy"].time) == [2.0, 3.0]
    # a value the user's regex captures but that is no number names file, line and metric
    with pytest.raises(FormatError, match=r"custom\.out:3: metric 'accuracy': cannot read "
                       r"'\?\?' as a number"):
        load_run(path, [MetricDefinition("accuracy", r"acc (\S+)")])


def test_metric_option_and_definition_file_errors(tmp_path: Path) -> None:
    d = parse_metric_option(r"train_time,time,scale:0.001=train_time:(\d+)ms")
    assert d == MetricDefinition("train_time", r"train_time:(\d+)ms", time=True, scale=0.001)
    with pytest.raises(ValueError, match="expected NAME=REGEX"):
        parse_metric_option("val_loss")
    with pytest.raises(ValueError, match="exactly one capture group"):
        parse_metric_option("val_loss=val_loss:\\S+")
    with pytest.raises(ValueError, match="unknown option 'fast'"):
        parse_metric_option("x,fast=x(\\d)")
    good = write(tmp_path / "defs.yaml", "- Name: val_loss\n  Regex: 'val: (\\S+)'\n"
                 "- {name: t, regex: 't=(\\d+)', time: true, scale: 0.001}\n")
    assert load_definitions(good) == [MetricDefinition("val_loss", r"val: (\S+)"),
                                      MetricDefinition("t", r"t=(\d+)", True, 0.001)]
    bad = write(tmp_path / "bad.yaml", "- name: loss\n  regex: 'loss (\\d+) (\\d+)'\n")
    with pytest.raises(FormatError, match=r"bad\.yaml: definition 1: .*exactly one capture"):
        load_definitions(bad)


def test_text_keeps_only_the_last_log_lines(tmp_path: Path) -> None:
    lines = [f"noise {i}" for i in range(MAX_LOG_LINES + 50)]
    job = load_run(write(tmp_path / "noisy.log", "\n".join(lines) + "\n"))
    assert len(job.logs) == MAX_LOG_LINES
    assert job.logs[0].text == "noise 50" and job.logs[-1].text == lines[-1]


# --- csv -------------------------------------------------------------------------------

LIGHTNING = """\
epoch,step,train_loss,val_loss
0,0,2.30,
0,1,nan,
0,1,,2.10
1,2,1.90,
"""


@pytest.mark.parametrize("gz", [False, True])
def test_csv_lightning_metrics(tmp_path: Path, gz: bool) -> None:
    (tmp_path / "version_3").mkdir()
    path = write(tmp_path / "version_3" / "metrics.csv", LIGHTNING, gz)
    assert detect_format(path) == "csv"
    job = load_run(path)
    assert job.id == "version_3" and job.clock == "step"
    train = job.series["train_loss"]
    assert list(train.step) == [0, 1, 2]  # the empty cell is missing, not a NaN
    assert train.value[0] == 2.3 and math.isnan(train.value[1]) and train.value[2] == 1.9
    assert list(job.series["val_loss"].value) == [2.1]
    assert list(job.series["epoch"].value) == [0, 0, 0, 1]
    assert list(job.series["step"].value) == [0, 1, 2]
    monotone(job)


def test_csv_keras_epoch_is_the_step(tmp_path: Path) -> None:
    job = load_run(write(tmp_path / "history.csv", "epoch,loss,val_loss\n0,1.0,1.2\n1,0.8,1.0\n"))
    assert job.clock == "step" and "epoch" not in job.series
    assert list(job.series["val_loss"].step) == [0, 1]
    assert list(job.series["step"].value) == [0, 1]


def test_csv_with_a_time_column(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "step,time,loss\n1,1717000000.0,3\n2,1717000060.0,2\n")
    job = load_run(path)
    assert job.clock == "wall"
    assert list(job.series["loss"].time) == [1717000000.0, 1717000060.0]


def test_csv_bad_cell_names_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "step,loss\n1,0.5\n2,abc\n")
    with pytest.raises(FormatError) as err:
        load_run(path)
    assert str(err.value) == f"{path}:3: column 'loss': cannot read 'abc' as a number"
    wide = write(tmp_path / "b.csv", "step,loss\n1,0.5,9\n")
    with pytest.raises(FormatError, match=r"b\.csv:2: row has 3 cells but the header has 2"):
        load_run(wide)


def test_a_csv_separated_otherwise_says_so(tmp_path: Path) -> None:
    # a spreadsheet in a decimal-comma locale writes ';' between cells
    path = write(tmp_path / "eu.csv", "step;loss\n1;0,5\n2;0,4\n")
    with pytest.raises(FormatError) as err:
        load_run(path)
    assert str(err.value) == (f"{path}:1: the header 'step;loss' reads as one column: are "
                              "its cells separated by ';'? write them with ',' between them")
    tabs = write(tmp_path / "tabs.csv", "step\tloss\n1\t0.5\n")
    with pytest.raises(FormatError, match=r"tabs\.csv:1: .* by a tab\? .* name the file \.tsv"):
        load_run(tabs)
    # one column is a run too: a loss and nothing else
    assert list(load_run(write(tmp_path / "one.csv", "loss\n0.5\n0.4\n")).series) == ["loss"]


# --- jsonl -----------------------------------------------------------------------------

def test_jsonl_records(tmp_path: Path) -> None:
    path = write(tmp_path / "metrics.jsonl", (
        '{"step": 1, "timestamp": 1717000000, "loss": 2.0, "phase": "train"}\n'
        '{"step": 2, "timestamp": 1717000010500, "loss": NaN, "val": {"loss": "nan"}}\n'
        '\n'
        '{"step": 3, "timestamp": "2024-05-29T16:27:00+00:00", "loss": 1.5}\n'
        '{"step": 4, "timestamp": 1717000'))  # the last line is still being written
    assert detect_format(path) == "jsonl"
    job = load_run(path)
    assert job.clock == "wall"
    loss = job.series["loss"]
    assert list(loss.step) == [1, 2, 3]
    assert loss.time == pytest.approx([1717000000, 1717000010.5,
                                       parse_timestamp("2024-05-29T16:27:00+00:00")])
    assert math.isnan(loss.value[1]) and math.isnan(job.series["val/loss"].value[0])
    assert "phase" not in job.series


def test_jsonl_elapsed_time_and_errors(tmp_path: Path) -> None:
    job = load_run(write(tmp_path / "r.ndjson", '{"epoch": 0, "time": 5.0, "acc": 0.5}\n'
                         '{"epoch": 1, "time": 9.0, "acc": 0.6}\n'))
    assert job.clock == "elapsed" and list(job.series["acc"].time) == [5.0, 9.0]
    assert list(job.series["acc"].step) == [0, 1]  # no step key: the epoch is the step
    bad = write(tmp_path / "bad.jsonl", '{"step": 1, "loss": 1}\n{"step": 2, loss}\n'
                '{"step": 3, "loss": 1}\n')
    with pytest.raises(FormatError, match=r"bad\.jsonl:2: not valid JSON"):
        load_run(bad)
    arr = write(tmp_path / "arr.jsonl", "[1, 2]\n")
    with pytest.raises(FormatError, match=r"arr\.jsonl:1: expected a JSON object, found list"):
        load_run(arr)


# --- Hugging Face ----------------------------------------------------------------------

def trainer_state(done: bool) -> dict[str, object]:
    history: list[dict[str, object]] = [
        {"epoch": 0.1, "grad_norm": 3.2, "learning_rate": 5e-5, "loss": 2.9, "step": 10},
        {"epoch": 0.2, "grad_norm": float("nan"), "learning_rate": 4e-5, "loss": 2.5, "step": 20},
        {"epoch": 0.2, "eval_loss": 2.6, "eval_runtime": 3.1, "step": 20},
    ]
    if done:
        history.append({"epoch": 0.4, "step": 40, "total_flos": 1e15, "train_loss": 2.7,
                        "train_runtime": 100.0})
    return {"global_step": 40 if done else 20, "max_steps": 40, "log_history": history}


@pytest.mark.parametrize("gz", [False, True])
def test_hf_trainer_state(tmp_path: Path, gz: bool) -> None:
    (tmp_path / "checkpoint-20").mkdir()
    path = write(tmp_path / "checkpoint-20" / "trainer_state.json",
                 json.dumps(trainer_state(done=False), indent=2), gz)
    assert detect_format(path) == "hf"
    job = load_run(path)
    assert job.id == "checkpoint-20" and job.clock == "step" and job.planned_steps == 40
    assert job.state == JobState.RUNNING
    assert list(job.series["loss"].value) == [2.9, 2.5]
    assert math.isnan(job.series["grad_norm"].value[1])
    assert list(job.series["eval_loss"].step) == [20]
    assert list(job.series["learning_rate"].time) == [10, 20]
    assert list(job.series["step"].value) == [10, 20]


def test_hf_finished_run_and_bad_json(tmp_path: Path) -> None:
    path = write(tmp_path / "trainer_state.json", json.dumps(trainer_state(done=True)))
    job = load_run(tmp_path)  # the output folder holding trainer_state.json
    assert job.state == JobState.SUCCEEDED
    assert "train_runtime" not in job.series and "total_flos" not in job.series
    path.write_text('{"log_history": [\n  {"step": 1,\n  oops}\n]}')
    with pytest.raises(FormatError, match=r"trainer_state\.json:3: not valid JSON"):
        load_run(path)


# --- TensorBoard -----------------------------------------------------------------------

def write_events(logdir: Path) -> list[float]:
    from tensorboardX import SummaryWriter

    times = [1717000000.0 + 10 * i for i in range(4)]
    with SummaryWriter(str(logdir)) as w:
        for i, (t, v) in enumerate(zip(times, [2.0, 1.5, float("nan"), 1.2], strict=True)):
            w.add_scalar("train/loss", v, global_step=i * 100, walltime=t)
        w.add_scalar("val/loss", 1.7, global_step=300, walltime=times[-1])
        w.add_text("note", "not a scalar", global_step=0)
    return times


def test_tensorboard_event_files(tmp_path: Path) -> None:
    times = write_events(tmp_path / "tb")
    [event_file] = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    for path in (tmp_path / "tb", event_file):
        assert detect_format(path) == "tensorboard"
        job = load_run(path)
        assert job.clock == "wall" and job.id == "tb"
        loss = job.series["train/loss"]
        assert list(loss.time) == times and list(loss.step) == [0, 100, 200, 300]
        assert math.isnan(loss.value[2])
        assert list(job.series["val/loss"].value) == pytest.approx([1.7])
        assert "note" not in job.series
        assert list(job.series["step"].value) == [0, 100, 200, 300]
    gz = write(tmp_path / event_file.name, "")
    gz.unlink()
    with open(event_file, "rb") as src, gzip.open(str(gz) + ".gz", "wb") as dst:
        dst.write(src.read())
    job = load_run(str(gz) + ".gz")
    assert list(job.series["train/loss"].time) == times


def test_tensorboard_missing_package_is_a_clear_error(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    write_events(tmp_path / "tb")
    for name in [m for m in sys.modules if m.split(".")[0] == "tensorboard"] + ["tensorboard"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    with pytest.raises(FormatError, match="needs the 'tensorboard' package"):
        load_run(tmp_path / "tb")


def test_tensorboard_garbage_is_a_format_error(tmp_path: Path) -> None:
    path = write(tmp_path / "events.out.tfevents.1.host", "")
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(FormatError, match=r"events\.out\.tfevents\.1\.host"):
        load_run(path)


# --- MLflow ----------------------------------------------------------------------------

def mlflow_runs(uri: str) -> dict[str, str]:
    """Two runs written by the real mlflow package: an old finished one and a newer one
    that was killed with a NaN and an inf in its loss."""
    import time

    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("exp")
    old = client.create_run(exp, run_name="old", tags={"team": "nlp"})
    client.log_metric(old.info.run_id, "loss", 3.0, step=0)
    client.set_terminated(old.info.run_id, "FINISHED")
    time.sleep(0.01)
    new = client.create_run(exp, run_name="new", tags={"team": "cv"})
    for step, value in enumerate([2.0, 1.5, float("nan"), float("inf")]):
        client.log_metric(new.info.run_id, "loss", value, step=step * 10)
    client.log_metric(new.info.run_id, "val_loss", 1.8, step=10)
    client.set_terminated(new.info.run_id, "KILLED")
    mlflow.set_tracking_uri("")
    return {"old": old.info.run_id, "new": new.info.run_id}


def check_mlflow(store: Path, runs: dict[str, str]) -> None:
    assert detect_format(store) == "mlflow"
    job = load_run(store)  # the most recent run
    assert job.id == runs["new"] and job.name == "new"
    assert job.state == JobState.STOPPED and job.raw_state == "KILLED"
    assert job.clock == "wall" and job.tags == {"team": "cv"}
    loss = job.series["loss"]
    assert list(loss.step) == [0, 10, 20, 30]
    assert math.isnan(loss.value[2]) and loss.value[3] == math.inf
    assert job.start_time is not None and job.end_time is not None
    assert job.start_time <= loss.time[0] <= job.end_time
    assert list(job.series["step"].value) == [0, 10, 20, 30]
    old = load_run(store, run="old")
    assert old.id == runs["old"] and old.state == JobState.SUCCEEDED
    assert list(old.series["loss"].value) == [3.0]
    with pytest.raises(FormatError, match="no MLflow run 'nope'"):
        load_run(store, run="nope")


def test_mlflow_file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    runs = mlflow_runs((tmp_path / "mlruns").as_uri())
    check_mlflow(tmp_path / "mlruns", runs)
    [run_dir] = [p for p in (tmp_path / "mlruns").glob("*/*") if p.name == runs["old"]]
    assert load_run(run_dir).id == runs["old"]  # a run folder is that run


def test_mlflow_sqlite_store(tmp_path: Path) -> None:
    pytest.importorskip("sqlalchemy", reason="mlflow's SQL store needs sqlalchemy to write")
    runs = mlflow_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    check_mlflow(tmp_path / "mlflow.db", runs)


# --- shared behaviour ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["run.log", "metrics.csv", "m.jsonl", "run.log.gz"])
def test_an_empty_file_is_a_run_that_has_just_started(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / name.removesuffix(".gz"), "", gz=name.endswith(".gz"))
    job = load_run(path)
    assert job.series == {} and job.logs == [] and job.state == JobState.RUNNING


def test_detection_by_content_and_errors(tmp_path: Path) -> None:
    assert detect_format(write(tmp_path / "noext", "step,loss\n1,2\n")) == "csv"
    assert detect_format(write(tmp_path / "lines", '{"step": 1, "loss": 2}\n')) == "jsonl"
    assert detect_format(write(tmp_path / "state.json", '{"log_history": []}')) == "hf"
    assert detect_format(write(tmp_path / "out", "hello\n")) == "text"
    assert set(FORMATS) == {"text", "csv", "jsonl", "hf", "tensorboard", "mlflow", "yolov5_txt"}
    with pytest.raises(FormatError, match="no such file"):
        load_run(tmp_path / "missing.log")
    with pytest.raises(FormatError, match="unknown format 'xml'"):
        load_run(tmp_path / "out", fmt="xml")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(FormatError, match="a folder with no"):
        load_run(tmp_path / "empty_dir")
    assert load_run(tmp_path / "out", job_id="mine").id == "mine"


def test_a_cut_gzip_file_is_a_format_error(tmp_path: Path) -> None:
    path = write(tmp_path / "run.log", NANOGPT * 50, gz=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError, match=r"run\.log\.gz: compressed file"):
        load_run(path)


def test_readers_never_leak_file_handles(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "step,loss\n1,x\n")
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    for _ in range(20):
        with pytest.raises(FormatError):
            load_run(path)
    after = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    assert after <= before + 1


def test_csv_half_written_last_row_is_skipped_until_complete(tmp_path: Path) -> None:
    """A watched run's CSV may end mid-row; a complete file keeps strictness."""
    from trainguard.adapters.local import FormatError, load_run

    p = tmp_path / "metrics.csv"
    p.write_text("step,loss\n0,2.5\n1,2.4\n2,2.")
    job = load_run(p)
    assert list(job.series["loss"].value[:2]) == [2.5, 2.4]
    p.write_text("step,loss\n0,2.5\n1,2.4\n2,ab")
    assert list(load_run(p).series["loss"].value) == [2.5, 2.4]
    p.write_text("step,loss\n0,2.5\n1,2.4\n2,ab\n")
    with pytest.raises(FormatError, match=r"metrics\.csv:4"):
        load_run(p)
