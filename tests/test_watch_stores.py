"""``watch`` on a path that holds many runs (an MLflow store, a TensorBoard log dir): every
run is its own job, judged, remembered and summarised on its own, as ``check`` does."""

from __future__ import annotations

import io
import math
import time
from pathlib import Path

import pytest
from rich.console import Console

from trainguard.checker.policy import Policy
from trainguard.lambdas.local import watch


def live_mlflow_store(uri: str) -> None:
    """Three runs still RUNNING (as while training), written with mlflow's own client: two
    healthy, one whose loss went NaN at step 30 and stayed there."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.create_experiment("vision")
    for name, nan_from in (("baseline", None), ("lr-high", 30), ("wd-0.1", None)):
        run_id = client.create_run(exp, run_name=name).info.run_id
        for step in range(0, 60, 2):
            loss = math.nan if nan_from is not None and step >= nan_from else \
                2.0 * 0.97 ** step + 0.1
            client.log_metric(run_id, "loss", loss, step=step)


def test_watch_judges_every_run_of_an_mlflow_store(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="pip install 'trainguard[formats]'")
    pytest.importorskip("sqlalchemy", reason="mlflow's SQL store needs sqlalchemy to write")
    db = tmp_path / "mlflow.db"
    live_mlflow_store(f"sqlite:///{db}")
    out = io.StringIO()
    result = watch([db], Policy(), tmp_path / "state.sqlite", 0.2,
                   Console(file=out, width=200), until=0.5)
    by_id = {o.job_id: o for o in result.runs}
    assert len(by_id) == 3, out.getvalue()
    # ids as ``check`` gives them: experiment/run name
    assert sorted(by_id) == ["vision/baseline", "vision/lr-high", "vision/wd-0.1"]
    nan = next(o for i, o in by_id.items() if i.endswith("/lr-high"))
    assert [(f["rule"], f["severity"]) for f in nan.findings] == [("divergence", "critical")]
    healthy = [o for i, o in by_id.items() if not i.endswith("/lr-high")]
    assert all(not o.findings for o in healthy)


def test_watch_judges_every_run_of_a_tensorboard_log_dir(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="pip install 'trainguard[formats]'")
    from tests.test_local_runs import tb_run

    logs = tmp_path / "runs"
    start = time.time() - 30 * 40  # written live: the last event is about now
    tb_run(logs / "a", {"loss": 2.0}, start=start)
    tb_run(logs / "b", {"loss": 2.0}, nan_from=25, start=start)
    out = io.StringIO()
    result = watch([logs], Policy(), tmp_path / "state.sqlite", 0.2,
                   Console(file=out, width=200), until=0.5)
    by_id = {o.job_id: o for o in result.runs}
    assert sorted(by_id) == ["a", "b"], out.getvalue()
    assert [f["rule"] for f in by_id["b"].findings] == ["divergence"]
    assert by_id["a"].findings == []


def test_two_watched_stores_keep_their_runs_apart(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="pip install 'trainguard[formats]'")
    from tests.test_local_runs import tb_run

    start = time.time() - 30 * 40
    for run in ("team1/a", "team1/b", "team2/a", "team2/b"):
        tb_run(tmp_path / run, {"loss": 2.0}, start=start)
    result = watch([tmp_path / "team1", tmp_path / "team2"], Policy(),
                   tmp_path / "state.sqlite", 0.2, Console(file=io.StringIO()), until=0.3)
    assert sorted(o.job_id for o in result.runs) == ["team1/a", "team1/b", "team2/a", "team2/b"]


def test_a_stop_on_one_run_of_a_store_reaches_the_process_writing_the_store(
        tmp_path: Path) -> None:
    """A real process (``sleep``) stands for the training that writes the store."""
    import subprocess

    from trainguard.checker import RuleConfig
    from trainguard.checker.model import Action, Severity
    from trainguard.checker.policy import Safety

    pytest.importorskip("tensorboard", reason="pip install 'trainguard[formats]'")
    from tests.test_local_runs import tb_run

    start = time.time() - 30 * 40
    logs = tmp_path / "runs"
    tb_run(logs / "a", {"loss": 2.0}, start=start)
    tb_run(logs / "b", {"loss": 2.0}, nan_from=25, start=start)
    policy = Policy(safety=Safety(dry_run=False, persist_ticks=1), rules={
        "divergence": RuleConfig(actions={Severity.CRITICAL: Action.STOP})})
    trainer = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        result = watch([logs], policy, tmp_path / "state.sqlite", 0.2,
                       Console(file=io.StringIO()), until=10, processes={logs: trainer},
                       grace_s=1)
        ended = trainer.wait(timeout=5)
    finally:
        trainer.kill()
    b = next(o for o in result.runs if o.job_id == "b")
    assert b.stopped_by == "divergence"
    assert ended == -15  # SIGTERM from the stop, before the watch's own end
    assert result.ended_at - result.started_at < 8
