"""Runs as an ML engineer has them on disk, written by the real libraries (mlflow, torch's
TensorBoard writer), judged by the real ``trainguard`` command: every run of a store is a
run, ids tell runs apart, the common spellings of the loss are recognised and named in
every finding, and ``check`` agrees with the last tick of ``replay``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainguard.adapters.local import Found, assign_ids, load_runs
from trainguard.adapters.local.ids import distinguishing_ids
from trainguard.adapters.local.names import role_of
from trainguard.cli import app

runner = CliRunner()


def run_cli(*args: Any) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def doc(result: Any) -> dict[str, Any]:
    assert result.exit_code in (0, 1, 2), result.output
    out: dict[str, Any] = json.loads(result.stdout)
    return out


# --- MLflow: every run of a store --------------------------------------------------------

def mlflow_store(uri: str) -> dict[str, str]:
    """Three runs in two experiments, written with mlflow's own client (its fluent API
    would leave an active experiment behind for later tests): a healthy finished run, a
    finished run whose loss went NaN at step 30 and stayed there, and a run of another
    experiment with the same run name as the first."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiments: dict[str, str] = {}
    ids = {}
    for exp, name, nan_from in (("vision", "baseline", None), ("vision", "lr-high", 30),
                                ("nlp", "baseline", None)):
        if exp not in experiments:
            experiments[exp] = client.create_experiment(exp)
        run_id = client.create_run(experiments[exp], run_name=name).info.run_id
        for step in range(0, 60, 2):
            loss = 2.0 * 0.97 ** step + 0.1
            if nan_from is not None and step >= nan_from:
                loss = math.nan
            client.log_metric(run_id, "loss", loss, step=step)
            if step % 10 == 0:
                client.log_metric(run_id, "val_loss", loss * 1.1, step=step)
        client.set_terminated(run_id, "FINISHED")
        ids[f"{exp}/{name}"] = run_id
    return ids


@pytest.fixture(params=["file", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    if request.param == "file":
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        path = tmp_path / "mlruns"
        return path, mlflow_store(path.as_uri())
    pytest.importorskip("sqlalchemy", reason="mlflow's SQL store needs sqlalchemy to write")
    path = tmp_path / "mlflow.db"
    return path, mlflow_store(f"sqlite:///{path}")


def test_every_mlflow_run_is_its_own_run(store: tuple[Path, dict[str, str]]) -> None:
    path, _ = store
    out = doc(run_cli("check", path, "--format", "json"))
    runs = {r["id"]: r for r in out["runs"]}
    assert set(runs) == {"vision/baseline", "vision/lr-high", "nlp/baseline"}
    assert runs["vision/lr-high"]["verdict"] == "critical"
    div = [f for f in runs["vision/lr-high"]["findings"] if f["rule"] == "divergence"]
    assert div and div[0]["series"] in ("loss", "val_loss") and div[0]["step"] == 30
    assert runs["vision/baseline"]["verdict"] == runs["nlp/baseline"]["verdict"] == "ok"


def test_run_picks_mlflow_runs_by_name_pattern_or_id(store: tuple[Path, dict[str, str]]) -> None:
    path, ids = store
    picked = doc(run_cli("check", path, "--run", "vision/*", "--format", "json"))
    assert sorted(r["id"] for r in picked["runs"]) == ["vision/baseline", "vision/lr-high"]
    by_id = doc(run_cli("check", path, "--run", ids["nlp/baseline"], "--format", "json"))
    assert [r["id"] for r in by_id["runs"]] == ["nlp/baseline"]
    missing = run_cli("check", path, "--run", "nope")
    assert missing.exit_code == 2 and "--run nope: no such run" in missing.output
    assert "vision/lr-high" in missing.output  # says which runs there are


def test_finished_mlflow_run_with_nan_check_agrees_with_replay(
        store: tuple[Path, dict[str, str]]) -> None:
    """The run is FINISHED in the store; check judged it "ok" before: the rules only judge
    running jobs. Now it is judged on everything it recorded, as replay's last tick."""
    path, _ = store
    checked = doc(run_cli("check", path, "--run", "vision/lr-high", "--format", "json"))
    replayed = doc(run_cli("replay", path, "--run", "vision/lr-high", "--format", "json",
                           "--tick", "5"))
    c, r = checked["runs"][0], replayed["runs"][0]
    assert c["verdict"] == "critical"
    # replay's findings at its last tick are the ones last seen at the run's end
    last = {f["rule"]: f["last_seen"]["severity"] for f in r["findings"]
            if f["last_seen"]["time"] == r["end"]}
    assert {f["rule"]: f["severity"] for f in c["findings"]} == last


# --- TensorBoard: a folder of runs ---------------------------------------------------------

def tb_run(folder: Path, tags: dict[str, float], steps: int = 40, nan_from: int | None = None,
           start: float = 1_717_000_000.0) -> None:
    """Scalars written by torch's own SummaryWriter, one event per step, 30 s apart."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(folder)) as w:
        for step in range(steps):
            for tag, scale in tags.items():
                v = scale * (0.95 ** step) + 0.05
                if nan_from is not None and step >= nan_from:
                    v = math.nan
                w.add_scalar(tag, v, global_step=step, walltime=start + 30 * step)


def test_a_folder_of_five_tensorboard_runs_is_five_runs(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="pip install 'trainguard[formats]'")
    logs = tmp_path / "logs"
    tb_run(logs / "resnet" / "lr0.1", {"Loss/train": 2.0, "Loss/val": 2.2})
    tb_run(logs / "resnet" / "lr0.01", {"loss/train": 2.0, "loss/val": 2.1})
    tb_run(logs / "vit" / "lr0.1", {"train/loss": 2.0, "val/loss": 2.2}, nan_from=25)
    tb_run(logs / "vit" / "lr0.01", {"train/loss": 2.0})
    # Keras's TensorBoard callback: one run split in train/ and validation/
    tb_run(logs / "keras" / "train", {"epoch_loss": 1.0})
    tb_run(logs / "keras" / "validation", {"epoch_loss": 1.2})
    out = doc(run_cli("check", logs, "--format", "json"))
    ids = [r["id"] for r in out["runs"]]
    assert sorted(ids) == ["keras", "resnet/lr0.01", "resnet/lr0.1", "vit/lr0.01", "vit/lr0.1"]
    runs = {r["id"]: r for r in out["runs"]}
    assert runs["vit/lr0.1"]["verdict"] == "critical"
    div = [f for f in runs["vit/lr0.1"]["findings"] if f["rule"] == "divergence"]
    assert div[0]["series"] in ("train/loss", "val/loss")
    assert [r["verdict"] for i, r in runs.items() if i != "vit/lr0.1"] == ["ok"] * 4


@pytest.mark.parametrize(("name", "role"), [
    ("Loss/val", "val_loss"), ("val/loss", "val_loss"), ("eval_loss", "val_loss"),
    ("validation/epoch_loss", "val_loss"), ("loss/train", "loss"), ("Loss/train", "loss"),
    ("train/epoch_loss", "loss"), ("train_loss", "loss"),
    ("val_loss_ema", None), ("train/aux_loss", None), ("lr", None), ("loss/val/train", None),
])
def test_spellings_of_the_loss(name: str, role: str | None) -> None:
    assert role_of(name) == role


def test_plateau_on_a_spelt_val_loss_names_that_series(tmp_path: Path) -> None:
    """A flat ``Loss/val`` is found without a policy map, and the finding says
    ``Loss/val``, not the well-known name it was recognised as."""
    pytest.importorskip("tensorboard", reason="pip install 'trainguard[formats]'")
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path / "flat")) as w:
        for step in range(300):
            w.add_scalar("Loss/val", 0.6931 + 1e-5 * ((step * 7) % 3), global_step=step,
                         walltime=1_717_000_000.0 + 60 * step)
    out = doc(run_cli("check", tmp_path / "flat", "--format", "json"))
    plateau = [f for f in out["runs"][0]["findings"] if f["rule"] == "plateau"]
    assert plateau and plateau[0]["series"] == "Loss/val", out["runs"][0]["findings"]
    assert "Loss/val" in plateau[0]["message"]


# --- ids ---------------------------------------------------------------------------------

def test_ids_are_the_nearest_distinguishing_parts() -> None:
    assert distinguishing_ids([["x", "lightning_logs", "version_0"],
                               ["x", "lightning_logs", "version_1"]]) == ["version_0", "version_1"]
    assert distinguishing_ids([["a", "lightning_logs", "version_0"],
                               ["b", "lightning_logs", "version_0"],
                               ["b", "lightning_logs", "version_1"]]) == [
        "a/version_0", "b/version_0", "b/version_1"]
    # runs elsewhere keep their short names
    assert distinguishing_ids([["logs", "resnet", "lr0.1"], ["logs", "vit", "lr0.1"],
                               ["logs", "keras"]]) == ["resnet/lr0.1", "vit/lr0.1", "keras"]
    assert distinguishing_ids([["r", "run"], ["r", "run"]]) == ["r/run#1", "r/run#2"]


def test_lightning_versions_of_two_experiments_get_ids_that_tell_them_apart(
        tmp_path: Path) -> None:
    for exp in ("expA", "expB"):
        for v in (0, 1):
            folder = tmp_path / exp / "lightning_logs" / f"version_{v}"
            folder.mkdir(parents=True)
            rows = "".join(f"{i},0,{2.0 - 0.01 * i}\n" for i in range(50))
            (folder / "metrics.csv").write_text("step,epoch,train_loss\n" + rows)
    out = doc(run_cli("check", tmp_path, "--format", "json"))
    assert sorted(r["id"] for r in out["runs"]) == [
        "expA/version_0", "expA/version_1", "expB/version_0", "expB/version_1"]


def test_ids_across_two_mlflow_stores_keep_experiment_and_run(tmp_path: Path) -> None:
    job = __import__("trainguard.checker.model", fromlist=["Job"]).Job
    found = [Found(tmp_path / "a" / "mlruns", "exp/run", job("1")),
             Found(tmp_path / "b" / "mlruns", "exp/run", job("2")),
             Found(tmp_path / "b" / "mlruns", "exp/other", job("3"))]
    assign_ids(found)
    assert [f.job.id for f in found] == ["a/exp/run", "b/exp/run", "b/exp/other"]


# --- Hugging Face output folder ------------------------------------------------------------

def state(step: int, losses: list[float], summary: bool = False) -> str:
    history: list[dict[str, Any]] = [{"step": i + 1, "loss": v, "epoch": 0.1 * (i + 1)}
                                     for i, v in enumerate(losses[:step])]
    if summary:
        history.append({"step": step, "train_runtime": 12.5, "train_loss": 1.0,
                        "total_flos": 1e12, "epoch": 1.0})
    return json.dumps({"global_step": step, "max_steps": len(losses), "log_history": history})


def test_a_trainer_output_folder_is_one_run_from_its_latest_state(tmp_path: Path) -> None:
    losses = [2.0 - 0.01 * i for i in range(40)] + [math.nan] * 20
    out = tmp_path / "out"
    for step in (20, 40, 60):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        (out / f"checkpoint-{step}" / "trainer_state.json").write_text(
            state(step, losses, summary=step == 60).replace("NaN", "NaN"))
    # the Trainer's TensorBoard logs beside the checkpoints do not make it a second run
    (out / "runs").mkdir()
    found = load_runs(out)
    assert len(found) == 1
    result = doc(run_cli("check", tmp_path, "--format", "json"))
    assert [r["id"] for r in result["runs"]] == ["out"]
    assert result["runs"][0]["verdict"] == "critical"  # the NaN is only in checkpoint-60


def test_a_folder_with_tensorboard_runs_and_other_logs_finds_them_all(tmp_path: Path) -> None:
    """A folder of runs is entered: the CSV log beside the TensorBoard runs is a run too."""
    pytest.importorskip("tensorboard", reason="pip install 'trainguard[formats]'")
    tb_run(tmp_path / "tb" / "a", {"train/loss": 2.0})
    tb_run(tmp_path / "tb" / "b", {"train/loss": 2.0})
    rows = "".join(f"{i},{2.0 - 0.01 * i}\n" for i in range(50))
    (tmp_path / "keras.csv").write_text("epoch,loss\n" + rows)
    out = doc(run_cli("check", tmp_path, "--format", "json"))
    assert sorted((r["id"], r["format"]) for r in out["runs"]) == [
        ("a", "tensorboard"), ("b", "tensorboard"), ("keras", "csv")]


@pytest.mark.slow
def test_real_lightning_versions_of_two_experiments(tmp_path: Path) -> None:
    """Three real Lightning fits writing with its own CSVLogger and TensorBoardLogger (the
    ``version_N`` folders every Lightning user has): three runs, named by experiment and
    version; the one whose loss goes NaN is the critical one."""
    torch = pytest.importorskip("torch", reason="pip install 'trainguard[train]'")
    L = pytest.importorskip("lightning", reason="pip install 'trainguard[train]'")
    pytest.importorskip("tensorboard", reason="pip install 'trainguard[formats]'")
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self, nan_from: int | None) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)
            self.nan_from = nan_from

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = torch.nn.functional.mse_loss(self.lin(batch[0]), batch[1])
            if self.nan_from is not None and self.global_step >= self.nan_from:
                loss = loss * math.nan
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    x = torch.randn(256, 8)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    for exp, version, nan_from in (("expA", 0, None), ("expA", 1, 20), ("expB", 0, None)):
        # both loggers in one version_N folder, as a user pairing them sets it
        loggers = [CSVLogger(str(tmp_path / exp), version=version),
                   TensorBoardLogger(str(tmp_path / exp), version=version)]
        L.Trainer(max_steps=30, log_every_n_steps=1, logger=loggers, accelerator="cpu",
                  enable_progress_bar=False, enable_model_summary=False,
                  enable_checkpointing=False).fit(Tiny(nan_from), data)
    out = doc(run_cli("check", tmp_path, "--format", "json"))
    verdicts = {r["id"]: r["verdict"] for r in out["runs"]}
    assert verdicts == {"expA/version_0": "ok", "expA/version_1": "critical",
                        "expB/version_0": "ok"}, verdicts
