"""``check`` at the end of a run and the last tick of ``replay`` say the same: on every run
of both shared corpora, and on a real Hugging Face ``Trainer`` run whose NaN sits in its
final ``trainer_state.json`` (the one ending with the end-of-training summary), whose
callback log is judged alike."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from trainguard.adapters.local import load_runs
from trainguard.checker.evaluate import build_rules
from trainguard.checker.model import verdict
from trainguard.cli import app, judge_finished
from trainguard.config import default_policy
from trainguard.replay import first_record, replay
from trainguard.report import Run

RUNS = Path(ROOT.parent / "shared" / "data" / "runs")
runner = CliRunner()
#: ticks per replay here: only the last one is compared, so a coarse tick will do
TICKS = 4


def corpus_files(curves_dir: Path) -> list[Path]:
    roots = [curves_dir] + ([RUNS] if (RUNS / "labels.csv").is_file() else [])
    return [p for root in roots for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in ("labels.csv", "SOURCES.md")]


def test_check_agrees_with_the_last_tick_of_replay_on_both_corpora(curves_dir: Path) -> None:
    if not (RUNS / "labels.csv").is_file():
        pytest.skip(f"the second corpus is not at {RUNS}")
    pol = default_policy()
    rules = build_rules(pol)
    disagree: list[tuple[str, str, str]] = []
    families: dict[str, int] = {}
    for path in corpus_files(curves_dir):
        for found in load_runs(path):
            job = found.job
            checked = judge_finished(Run(str(path), None, job), pol, rules, None)
            start, end = first_record(job), job.last_time()
            tick = max((end - start) / TICKS, 1e-3) if start is not None and end else 1.0
            last = verdict(replay(job, pol, tick, rules=rules).final)
            family = path.relative_to(path.parents[1]).parts[0]
            families[family] = families.get(family, 0) + 1
            if checked.verdict not in (last, "no data"):
                disagree.append((str(path), checked.verdict, last))
    assert sum(families.values()) > 400, families
    assert not disagree, disagree


# --- a real Trainer ----------------------------------------------------------------------

STEPS, NAN_AT = 80, 60


def trainer_run(tmp_path: Path) -> tuple[Path, Path]:
    """A small MLP trained by the real Trainer on scikit-learn's digits for 80 steps;
    its weights are poisoned with NaN at step 60. The callback writes with emit's default
    rate limit (10 s), as a user's script would; the Trainer saves checkpoints and, at the
    end, its state."""
    torch = pytest.importorskip("torch", reason="pip install 'trainguard[train]'")
    tf = pytest.importorskip("transformers", reason="pip install 'trainguard[train]'")
    pytest.importorskip("sklearn.datasets", reason="pip install 'trainguard[demo]'")
    from trainguard.callbacks.hf import TrainguardCallback
    from trainguard.emit import Emitter

    class Poison(tf.TrainerCallback):  # type: ignore[misc,name-defined]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == NAN_AT - 1:
                with torch.no_grad():
                    kw["model"].classifier.weight.fill_(math.nan)

    from tests.test_callbacks import DigitsMLP, digits

    torch.manual_seed(0)
    x, y = digits()
    rows = [{"input_ids": x[i], "labels": y[i]} for i in range(len(y))]
    out = tmp_path / "out"
    args = tf.TrainingArguments(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=32,
        per_device_eval_batch_size=64, learning_rate=1e-2, logging_steps=2,
        eval_strategy="steps", eval_steps=20, save_strategy="steps", save_steps=40,
        report_to=[], use_cpu=True, disable_tqdm=True, seed=0, save_only_model=True)
    log = tmp_path / "train.log"
    with log.open("w") as f:
        trainer = tf.Trainer(model=DigitsMLP(), args=args,
                             train_dataset=rows[:1500], eval_dataset=rows[1500:1628],
                             callbacks=[TrainguardCallback(Emitter(stream=f)), Poison()])
        trainer.train()
        trainer.save_state()  # out/trainer_state.json, ending with the summary entry
    return out, log


def judged(path: Path, command: str = "check") -> dict[str, Any]:
    result = runner.invoke(app, [command, str(path), "--format", "json"])
    assert result.exit_code in (0, 1), result.output
    run: dict[str, Any] = json.loads(result.stdout)["runs"][0]
    return run


@pytest.mark.slow
def test_trainer_final_state_check_agrees_with_replay_and_the_callback(tmp_path: Path) -> None:
    out, log = trainer_run(tmp_path)
    state = json.loads((out / "trainer_state.json").read_text())
    assert "train_runtime" in state["log_history"][-1]  # the summary is the last entry
    checked = judged(out / "trainer_state.json")
    replayed = judged(out / "trainer_state.json", "replay")
    assert checked["verdict"] == "critical", checked
    div = [f for f in checked["findings"] if f["rule"] == "divergence"]
    assert div and div[0]["step"] == NAN_AT
    end = replayed["end"]
    last = {f["rule"]: f["last_seen"]["severity"] for f in replayed["findings"]
            if f["last_seen"]["time"] == end}
    assert {f["rule"]: f["severity"] for f in checked["findings"]} == last
    # the output folder (with its checkpoint-N folders) is one run: the latest state
    folder = judged(out)
    assert folder["id"] == "out" and folder["verdict"] == "critical"
    # the callback's log, written under the default rate limit, holds every Trainer log
    # and every evaluation, and is judged alike
    text = log.read_text()
    assert text.count("event=eval") == STEPS // 20
    assert text.count(" loss=") >= STEPS // 2 - 1
    from_log = judged(log)
    assert from_log["verdict"] == checked["verdict"]
    assert {f["rule"] for f in from_log["findings"]} >= {"divergence"}
