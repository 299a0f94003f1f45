"""Real tiny trainings on the CPU with each framework, reported by trainguard's callbacks
and judged by ``trainguard check`` with the shipped definitions.

Healthy runs are judged clean; a NaN injected from step K is a critical divergence; a log
that stops at step K while time goes on is a stall.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch", reason="torch not installed: pip install 'trainguard[train]'")
datasets = pytest.importorskip("sklearn.datasets",
                               reason="scikit-learn not installed: pip install 'trainguard[demo]'")

from trainguard.adapters.local import load_run  # noqa: E402
from trainguard.checker.evaluate import evaluate  # noqa: E402
from trainguard.cli import app  # noqa: E402
from trainguard.config import default_policy  # noqa: E402
from trainguard.emit import Emitter  # noqa: E402

pytestmark = pytest.mark.slow
runner = CliRunner(env={"COLUMNS": "200"})
STEPS, NAN_FROM, HANG_AT = 48, 30, 24


def digits() -> tuple[Any, Any]:
    """scikit-learn's bundled 8x8 digits (no download): pixels 0..16 and labels."""
    data = datasets.load_digits()
    return torch.tensor(data.data, dtype=torch.long), torch.tensor(data.target)


def check(log: Path) -> tuple[int, list[dict[str, Any]]]:
    """``trainguard check --format json`` on the captured log: exit code and findings."""
    result = runner.invoke(app, ["check", str(log), "--format", "json"])
    assert result.exit_code in (0, 1), result.output
    doc = json.loads(result.stdout)
    return result.exit_code, doc["runs"][0]["findings"]


def loud(findings: list[dict[str, Any]]) -> list[str]:
    return [f"{f['rule']} {f['severity']}: {f['message']}" for f in findings
            if f["severity"] in ("warning", "critical")]


def cut_at(log: Path, step: int, out: Path) -> Path:
    """The log as a hung job leaves it: nothing after the first line at ``step``."""
    lines = []
    for line in log.read_text().splitlines(keepends=True):
        lines.append(line)
        if f" step={step}/" in line:
            break
    out.write_text("".join(lines))
    return out


def assert_hang_is_a_stall(log: Path, tmp_path: Path) -> None:
    hung = load_run(cut_at(log, HANG_AT, tmp_path / "hung.log"))
    last = hung.last_time()
    assert last is not None and hung.clock == "wall"
    pol = default_policy()
    # right after the last line: nothing wrong yet; an hour of silence later: a stall
    assert not [f for f in evaluate([hung], pol, last + 1) if f.rule == "stall"]
    stalls = [f for f in evaluate([hung], pol, last + 3600) if f.rule == "stall"]
    assert stalls and stalls[0].severity.value == "critical", stalls
    assert stalls[0].step == HANG_AT


def assert_reads_back(log: Path) -> None:
    job = load_run(log)
    assert job.planned_steps == STEPS
    for name in ("loss", "lr", "grad_norm", "throughput", "val_loss", "heartbeat/eval"):
        assert name in job.series and len(job.series[name]), f"{name} not read from {log}"
    assert float(job.series["step"].value.max()) == STEPS


# --- Hugging Face ------------------------------------------------------------------------



class DigitsMLP(torch.nn.Module):  # type: ignore[misc,name-defined]  # torch is importorskip's
    """A small MLP over the 8x8 pixels, in the Trainer's model protocol (keyword inputs,
    a dict with ``loss`` and ``logits``): it learns digits in a few dozen steps, where a
    tiny transformer sits at chance (ln 10) for as long."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(64, 64)
        self.classifier = torch.nn.Linear(64, 10)

    def forward(self, input_ids: Any, labels: Any = None) -> dict[str, Any]:
        logits = self.classifier(torch.relu(self.hidden(input_ids.float() / 16.0)))
        loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def hf_run(tmp_path: Path, name: str, extra: list[Any]) -> Path:
    tf = pytest.importorskip("transformers",
                             reason="transformers not installed: pip install 'trainguard[train]'")
    from trainguard.callbacks.hf import TrainguardCallback

    torch.manual_seed(0)
    x, y = digits()
    rows = [{"input_ids": x[i], "labels": y[i]} for i in range(len(y))]
    train, val = rows[:1500], rows[1500:1628]
    args = tf.TrainingArguments(
        output_dir=str(tmp_path / f"{name}-out"), max_steps=STEPS,
        per_device_train_batch_size=32, per_device_eval_batch_size=64, learning_rate=1e-2,
        logging_steps=1, eval_strategy="steps", eval_steps=16, save_strategy="steps",
        save_steps=24, report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
        save_only_model=True)
    log = tmp_path / f"{name}.log"
    with log.open("w") as f:
        cb = TrainguardCallback(Emitter(interval=0, stream=f))
        trainer = tf.Trainer(model=DigitsMLP(), args=args, train_dataset=train,
                             eval_dataset=val, callbacks=[cb, *extra])
        trainer.train()
    return log


def test_hf_healthy_run_is_judged_clean_and_a_hang_is_a_stall(tmp_path: Path) -> None:
    log = hf_run(tmp_path, "hf-healthy", [])
    assert_reads_back(log)
    text = log.read_text()
    assert "pause phase=checkpoint" in text and "event=checkpoint" in text
    code, findings = check(log)
    assert code == 0 and not loud(findings), loud(findings)
    assert_hang_is_a_stall(log, tmp_path)


def test_hf_nan_from_step_k_is_a_critical_divergence(tmp_path: Path) -> None:
    from transformers import TrainerCallback

    class PoisonWeights(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == NAN_FROM - 1:
                with torch.no_grad():
                    kw["model"].classifier.weight.fill_(math.nan)

    log = hf_run(tmp_path, "hf-nan", [PoisonWeights()])
    code, findings = check(log)
    div = [f for f in findings if f["rule"] == "divergence"]
    assert code == 1 and div and div[0]["severity"] == "critical", findings
    assert div[0]["step"] == NAN_FROM


# --- PyTorch Lightning -------------------------------------------------------------------

def lightning_run(tmp_path: Path, name: str, nan_from: int | None) -> Path:
    L = pytest.importorskip("lightning",
                            reason="lightning not installed: pip install 'trainguard[train]'")
    from torch.utils.data import DataLoader, TensorDataset

    from trainguard.callbacks.lightning import TrainguardCallback

    class MLP(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                           torch.nn.Linear(32, 10))

        def forward(self, x: Any) -> Any:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = torch.nn.functional.cross_entropy(self(batch[0]), batch[1])
            # global_step counts finished steps: this batch is reported as step global_step+1
            if nan_from is not None and self.global_step + 1 >= nan_from:
                loss = loss * math.nan  # the injected divergence
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", torch.nn.functional.cross_entropy(self(batch[0]), batch[1]))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    torch.manual_seed(0)
    x, y = digits()
    xf = x.float() / 16.0
    train = DataLoader(TensorDataset(xf[:1500], y[:1500]), batch_size=32, shuffle=True)
    val = DataLoader(TensorDataset(xf[1500:], y[1500:]), batch_size=128)
    log = tmp_path / f"{name}.log"
    with log.open("w") as f:
        trainer = L.Trainer(
            max_steps=STEPS, val_check_interval=16, accelerator="cpu", devices=1,
            logger=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, default_root_dir=str(tmp_path / f"{name}-out"),
            callbacks=[TrainguardCallback(Emitter(interval=0, stream=f))])
        trainer.fit(MLP(), train, val)
    return log


def test_lightning_healthy_run_is_judged_clean_and_a_hang_is_a_stall(tmp_path: Path) -> None:
    log = lightning_run(tmp_path, "pl-healthy", None)
    assert_reads_back(log)
    assert "event=checkpoint" in log.read_text()
    code, findings = check(log)
    assert code == 0 and not loud(findings), loud(findings)
    assert_hang_is_a_stall(log, tmp_path)


def test_lightning_nan_from_step_k_is_a_critical_divergence(tmp_path: Path) -> None:
    log = lightning_run(tmp_path, "pl-nan", NAN_FROM)
    code, findings = check(log)
    div = [f for f in findings if f["rule"] == "divergence"]
    assert code == 1 and div and div[0]["severity"] == "critical", findings
    assert div[0]["step"] == NAN_FROM


