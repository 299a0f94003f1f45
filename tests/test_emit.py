"""trainguard.emit: the line format, its rate limit, heartbeats and sinks, read back with
the shipped definitions."""

from __future__ import annotations

import io
import json
import math
import re
import socket
import subprocess
import sys
import timeit
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainguard.adapters.local import load_run
from trainguard.adapters.local.emit_format import EMIT_DEFINITIONS, emit_definition
from trainguard.checker.evaluate import evaluate
from trainguard.cli import app
from trainguard.config import default_policy
from trainguard.emit import Emitter, PrometheusSink, sinks_from_env

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    """A settable wall clock for the ``t=`` and timestamp of each line."""

    def __init__(self, t: float = 1_764_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_import_needs_nothing_but_the_standard_library() -> None:
    # -S: no site-packages at all, so any third-party import would fail here
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import trainguard.emit as e; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'numpy', 'typer', 'pydantic', 'yaml', 'adapters', 'checker'}); "
            "print(bad); e.emit(step=1, loss=0.5)")
    out = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT)], capture_output=True,
                         text=True, check=True).stdout
    assert out.splitlines()[0] == "[]"
    assert re.fullmatch(r"\S+Z trainguard: step=1 loss=0\.5 t=\d+\.\d{3}", out.splitlines()[1])


def test_lines_read_back_with_the_shipped_definitions_non_finite_kept(tmp_path: Path) -> None:
    buf, clock = io.StringIO(), Clock()
    e = Emitter(interval=0, stream=buf, total_steps=500, clock=clock)
    acc: dict[str, Any] = {"train/acc": 0.5}  # a name no keyword argument can spell
    for step in range(1, 6):
        clock.t += 2.0
        e.emit(step=step, loss=2.0 / step, lr=3e-4, grad_norm=0.7, **acc)
    e.emit(step=6, loss=math.nan, grad_norm=math.inf)
    e.emit(step=7, loss=-math.inf)
    log = tmp_path / "run.log"
    log.write_text(buf.getvalue())
    assert "train_acc=0.5" in buf.getvalue()  # a key with a '/' stays one token
    job = load_run(log)
    assert job.clock == "wall" and job.planned_steps == 500
    loss = job.series["loss"].value
    assert list(loss[:5]) == pytest.approx([2.0, 1.0, 2 / 3, 0.5, 0.4], rel=1e-6)
    assert math.isnan(loss[5]) and loss[6] == -math.inf
    assert job.series["grad_norm"].value[-1] == math.inf
    assert list(job.series["step"].value) == [1, 2, 3, 4, 5, 6, 7]
    assert job.series["step"].time[1] - job.series["step"].time[0] == pytest.approx(2.0)
    # a custom key needs its own definition, built the same way
    extra = load_run(log, [emit_definition("train_acc", "acc")])
    assert list(extra.series["acc"].value) == [0.5] * 5


def test_a_launcher_prefix_keeps_the_clock_from_t(tmp_path: Path) -> None:
    buf, clock = io.StringIO(), Clock()
    e = Emitter(interval=0, stream=buf, clock=clock)
    for step in range(3):
        clock.t += 5.0
        e.emit(step=step, loss=1.0)
    log = tmp_path / "prefixed.log"
    # a prefix that hides the ISO stamp (not blanks and bracketed tags): the clock is t=
    log.write_text("".join(f"worker-0 | {line}\n" for line in buf.getvalue().splitlines()))
    job = load_run(log)
    assert job.clock == "elapsed"
    assert list(job.series["step"].time) == pytest.approx([clock.t - 10, clock.t - 5, clock.t])
    # torchrun's "[rank0]: " leaves the stamp readable: the same times on the wall clock
    log.write_text("".join(f"[rank0]: {line}\n" for line in buf.getvalue().splitlines()))
    job = load_run(log)
    assert job.clock == "wall"
    assert list(job.series["step"].time) == pytest.approx([clock.t - 10, clock.t - 5, clock.t])


def test_rate_limit_writes_first_non_finite_and_events_only() -> None:
    buf = io.StringIO()
    e = Emitter(interval=3600, stream=buf)
    assert e.emit(step=1, loss=1.0)  # the first call
    assert not e.emit(step=2, loss=0.9)
    assert not e.record(3, {"loss": 0.8})
    assert e.emit(step=4, loss=math.nan)  # the divergence rule must see it
    assert e.emit(step=5, loss=0.7, lr=math.inf)
    assert e.emit(step=6, val_loss=0.6, event="eval")
    assert not e.emit(step=7, loss=0.5)
    assert (e.written, e.skipped) == (4, 3)
    assert [line.split(" trainguard: ")[1].rsplit(" t=", 1)[0]
            for line in buf.getvalue().splitlines()] == [
        "step=1 loss=1", "step=4 loss=nan", "step=5 loss=0.7 lr=inf",
        "event=eval step=6 val_loss=0.6"]


def test_a_skipped_call_costs_well_under_a_microsecond_budget() -> None:
    e = Emitter(interval=3600, stream=io.StringIO())
    e.emit(step=0, loss=1.0)
    best = min(timeit.repeat(lambda: e.emit(step=1, loss=2.345, lr=3e-4), number=20_000,
                             repeat=5)) / 20_000
    assert best < 5e-6, f"{best * 1e6:.2f} us per skipped call"  # ~0.3 us measured; slack


def test_pause_writes_heartbeats_read_as_heartbeat_series(tmp_path: Path) -> None:
    buf = io.StringIO()
    e = Emitter(interval=3600, stream=buf)
    e.emit(step=40, loss=1.0)
    with e.pause("eval", every=0.05):
        import time
        time.sleep(0.18)
    assert e.emit(step=41, loss=0.9)  # the first step after a pause is always written
    text = buf.getvalue()
    assert "trainguard: pause phase=eval step=40 elapsed=0 " in text
    assert len(re.findall(r"trainguard: heartbeat phase=eval step=40 elapsed=", text)) >= 2
    assert "trainguard: resume phase=eval step=40 elapsed=" in text
    log = tmp_path / "pause.log"
    log.write_text(text)
    job = load_run(log)
    beats = job.series["heartbeat"]
    assert len(beats) >= 3 and beats.value[0] == 0 and list(beats.value) == sorted(beats.value)
    assert list(job.series["heartbeat/eval"].value) == list(beats.value)
    assert "heartbeat/checkpoint" not in job.series
    assert 0.15 < job.series["pause_seconds"].value[0] < 1.0
    assert list(job.series["step"].value) == [40, 41]  # a heartbeat is not progress


def test_bad_phase_and_interval_are_clear_errors() -> None:
    e = Emitter(stream=io.StringIO())
    with pytest.raises(ValueError, match="phase/event 'eval loop'"):
        e.heartbeat("eval loop")
    with pytest.raises(ValueError, match="interval must be >= 0"):
        Emitter(interval=-1)
    with pytest.raises(ValueError, match="unknown sink 'statsd'"):
        sinks_from_env({"TRAINGUARD_SINKS": "statsd"})


def test_emitted_nan_is_a_critical_divergence_in_trainguard_check(tmp_path: Path) -> None:
    buf, clock = io.StringIO(), Clock()
    e = Emitter(interval=0, stream=buf, clock=clock)
    for step in range(1, 41):
        clock.t += 1.0
        e.emit(step=step, loss=math.nan if step >= 30 else 3.0 * 0.97 ** step)
    log = tmp_path / "nan.log"
    log.write_text(buf.getvalue())
    result = CliRunner().invoke(app, ["check", str(log), "--format", "json"])
    assert result.exit_code == 1, result.output
    findings = json.loads(result.stdout)["runs"][0]["findings"]
    div = [f for f in findings if f["rule"] == "divergence"]
    assert div and div[0]["severity"] == "critical" and div[0]["step"] == 30


def test_a_long_evaluation_with_heartbeats_is_not_a_stall(tmp_path: Path) -> None:
    buf, clock = io.StringIO(), Clock()
    e = Emitter(interval=0, stream=buf, clock=clock)
    for step in range(1, 61):
        clock.t += 10.0
        e.emit(step=step, loss=3.0 * 0.99 ** step)
    # a 40-minute evaluation, heartbeating every 30 s, still running
    e.heartbeat("eval", 0.0, "pause")
    for i in range(1, 81):
        clock.t += 30.0
        e.heartbeat("eval", 30.0 * i)
    log = tmp_path / "eval.log"
    log.write_text(buf.getvalue())
    job = load_run(log)
    findings = evaluate([job], default_policy(), clock.t + 5)
    assert not [f for f in findings if f.rule == "stall"]


def test_prometheus_sink_serves_the_gauges_for_scraping() -> None:
    pytest.importorskip("prometheus_client", reason="pip install 'trainguard[kubeflow]'")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = PrometheusSink("job-a", port=port)
    e = Emitter(interval=0, stream=io.StringIO(), sinks=(sink,))
    e.emit(step=7, loss=1.25)
    e.heartbeat("checkpoint", 12.0)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    # the names the Prometheus adapter's default mapping and the PrometheusRules read
    assert 'trainguard_step{run="job-a"} 7.0' in body
    assert 'trainguard_loss{run="job-a"} 1.25' in body
    assert 'trainguard_pause_elapsed_seconds{phase="checkpoint",run="job-a"} 12.0' in body
    sink.server[0].shutdown()


def test_mlflow_sink_logs_each_written_record(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow", reason="pip install mlflow-skinny")
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with mlflow.start_run() as run:
        e = Emitter(interval=3600, stream=io.StringIO(), sinks=sinks_from_env(
            {"TRAINGUARD_SINKS": "mlflow"}))
        e.emit(step=1, loss=2.0)
        e.emit(step=2, loss=1.5)  # rate-limited: neither the line nor MLflow
        e.emit(step=3, loss=math.nan)
    history = mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == [1, 3]
    mlflow.set_tracking_uri(before)
    assert history[0].value == 2.0 and math.isnan(history[1].value)


def test_shipped_definitions_use_no_python_only_regex_syntax() -> None:
    # the same regexes go to SageMaker and log shippers: no lookbehind, no inline flags
    for d in EMIT_DEFINITIONS:
        assert "(?<" not in d.regex and "(?i" not in d.regex, d
        assert len(d.regex) <= 500, d  # SageMaker's limit


def test_record_force_writes_past_the_rate_limit() -> None:
    """What the HF callback uses for the Trainer's own logs: they are paced already."""
    buf = io.StringIO()
    e = Emitter(interval=3600, stream=buf)
    assert e.record(1, {"loss": 2.0})
    assert not e.record(2, {"loss": 1.9})  # rate-limited
    assert e.record(3, {"loss": 1.8}, force=True)
    job = load_run_text(buf.getvalue())
    assert list(job.series["loss"].value) == pytest.approx([2.0, 1.8])
    assert list(job.series["loss"].step) == [1, 3]


def load_run_text(text: str) -> Any:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.log"
        path.write_text(text)
        return load_run(path)
