"""``plateau`` on a classifier whose held-out accuracy is 0 at every evaluation, and
Ultralytics' validation accuracy (``metrics/accuracy_top1``) read as held-out.

The failure class, seen on a held-out Ultralytics classification run: its training loss
fell 2.5 -> 0.05 while ``val/loss`` sat at 3.97-3.98 (ln 53) and top-1 and top-5
accuracy were 0 at all 22 epochs (validation labels that are not the training ones).
trainguard said "learnt and has levelled off: converged" (info): the held-out loss never
improved, and no accuracy was read, because ``metrics/...`` carries no word saying it is
measured on the validation set. Runs written as Ultralytics writes them, read by the real
reader.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.hf_state import trainer_state
from trainguard.adapters.local import load_run
from trainguard.checker import Policy, Severity, evaluate
from trainguard.checker.model import Job

HEADER = ("epoch", "train/loss", "metrics/accuracy_top1", "metrics/accuracy_top5", "val/loss",
          "lr/pg0")


def _results(tmp_path: Path, train: np.ndarray, top1: np.ndarray, top5: np.ndarray,
             val: np.ndarray) -> Job:
    """A ``results.csv`` as Ultralytics pads it (right-aligned columns)."""
    lines = [",".join(f"{h:>24}" for h in HEADER)]
    for e in range(len(train)):
        row = (e + 1, train[e], top1[e], top5[e], val[e], 1e-4)
        lines.append(",".join(f"{x:>24.5g}" for x in row))
    path = tmp_path / "runs" / "classify" / "train" / "results.csv"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    job = load_run(path)
    assert isinstance(job, Job)
    return job


def _plateau(job: Job) -> list[tuple[str, str, str]]:
    now = job.last_time()
    assert now is not None
    return [(f.severity.value, str(f.evidence["kind"]), f.message)
            for f in evaluate([job], Policy(), now) if f.rule == "plateau"]


def _train(n: int) -> np.ndarray:
    return 0.05 + 2.5 * np.exp(-np.arange(n) / 3)


def test_accuracy_zero_at_every_evaluation_and_a_held_out_loss_that_never_improved(
        tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 22
    val = 3.972 + 0.01 * (1 - np.exp(-np.arange(n) / 3)) + rng.normal(0, 0.0005, n)
    found = _plateau(_results(tmp_path, _train(n), np.zeros(n), np.zeros(n), val))
    assert [(sev, kind) for sev, kind, _ in found] == [("warning", "flat")]
    assert "metrics/accuracy_top1 is 0 at all 22 evaluations" in found[0][2]


def test_accuracy_zero_while_the_held_out_loss_learns_is_no_finding_of_that_kind(
        tmp_path: Path) -> None:
    """An accuracy logged as 0 by a run that does learn (its held-out loss falls 3-fold):
    the loss says it learns, so no *not learning* warning."""
    n = 22
    val = 1.0 + 2.0 * np.exp(-np.arange(n) / 4)
    found = _plateau(_results(tmp_path, _train(n), np.zeros(n), np.zeros(n), val))
    assert not [f for f in found if f[0] == "warning"], found


def test_accuracy_that_rises_from_zero_is_no_finding_of_that_kind(tmp_path: Path) -> None:
    n = 22
    top1 = np.r_[np.zeros(3), np.linspace(0.2, 0.9, n - 3)]
    val = 1.0 + 2.0 * np.exp(-np.arange(n) / 4)
    found = _plateau(_results(tmp_path, _train(n), top1, np.minimum(top1 + 0.1, 1), val))
    assert not [f for f in found if f[0] == "warning"], found


def test_ultralytics_top1_accuracy_at_one_over_k_confirms_chance_level(tmp_path: Path) -> None:
    """ln 53 is beyond the K trusted without an accuracy (2): Ultralytics' top-1 accuracy
    at 1/53 names K, as Keras' ``val_accuracy`` does."""
    rng = np.random.default_rng(1)
    n = 22
    val = np.log(53) + 0.01 + rng.normal(0, 0.002, n)
    top1 = 1 / 53 + rng.normal(0, 0.001, n)
    found = _plateau(_results(tmp_path, _train(n), top1, 5 * top1, val))
    assert [(sev, kind) for sev, kind, _ in found] == [("warning", "chance")], found
    assert "chance level ln 53" in found[0][2]
    assert Severity.WARNING.value == found[0][0]


def _state(tmp_path: Path, loss: list[float], name: str) -> Job:
    history = [{"step": 10 * (i + 1), "epoch": float(i + 1), "loss": x,
                "grad_norm": 0.0 if x == 0 else 1.0, "learning_rate": 2e-4}
               for i, x in enumerate(loss)]
    return trainer_state(tmp_path / name, history, max_steps=1000)


def test_a_loss_exactly_zero_from_its_first_record_is_not_learning(tmp_path: Path) -> None:
    """A held-out LoRA fine-tune logged ``loss 0.0`` and ``grad_norm 0.0`` at all 100
    records: nothing judged it (no level to improve on; the collapse test wants a fall to
    zero). A triplet loss that is mostly 0, and a loss that learns down to 0, are not
    this."""
    found = _plateau(_state(tmp_path, [0.0] * 100, "masked"))
    assert [(sev, kind) for sev, kind, _ in found] == [("warning", "flat")]
    assert "exactly 0 at all 100 points" in found[0][2]
    rng = np.random.default_rng(2)
    triplet = np.where(rng.random(100) < 0.8, 0.0, np.round(rng.random(100) * 0.05, 4))
    learnt = [*np.round(np.geomspace(0.7, 0.0001, 60), 4).tolist(), *[0.0] * 40]
    for name, loss in (("triplet", triplet.tolist()), ("learnt", learnt)):
        assert not [m for _, _, m in _plateau(_state(tmp_path, loss, name))
                    if "exactly 0 at all" in m], name
