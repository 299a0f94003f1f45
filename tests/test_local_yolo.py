"""YOLOv5's header-less ``results.txt`` (releases before v6.0), written in the test with
the format string ``train.py`` used, read by the real reader and judged by the real rules.

Two public YOLOv5 runs' ``results.txt`` got "no data: no metric or step recognised":
the text reader finds no key in a line of bare numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainguard.adapters.local import FormatError, detect_format, load_run
from trainguard.checker import Policy, evaluate
from trainguard.checker.model import Job

CSV_HEADER = ("epoch", "train/box_loss", "train/obj_loss", "train/cls_loss",
              "metrics/precision", "metrics/recall", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95",
              "val/box_loss", "val/obj_loss", "val/cls_loss", "x/lr0", "x/lr1", "x/lr2")


def _losses(n: int, diverge_at: int | None = None) -> np.ndarray:
    """Per epoch: box, obj, cls (training) and their validation twins, falling; from
    ``diverge_at`` on the training losses are NaN (YOLOv5 prints ``nan``)."""
    e = np.arange(n)[:, None]
    losses = np.hstack([0.02 + 0.08 * np.exp(-e / 15), 0.03 + 0.07 * np.exp(-e / 20),
                        0.002 + 0.02 * np.exp(-e / 10)] * 2)
    if diverge_at is not None:
        losses[diverge_at:, :3] = np.nan
    return losses


def _results_txt(path: Path, losses: np.ndarray, epochs: int | None = None) -> Path:
    """As YOLOv5 v5.0's ``train.py`` wrote each line:
    ``('%10s' * 2 + '%10.4g' * 6) % (f'{epoch}/{epochs - 1}', mem, *mloss, targets, imgsz)``
    then ``'%10.4g' * 7 % results``."""
    n = len(losses)
    last = (epochs or n) - 1
    lines = []
    for e, row in enumerate(losses):
        box, obj, cls, vbox, vobj, vcls = row
        mloss = (box, obj, cls, box + obj + cls)
        results = (0.5, 0.6, min(0.9, 0.1 + e / n), min(0.6, 0.05 + e / (2 * n)), vbox, vobj, vcls)
        lines.append(("%10s" * 2 + "%10.4g" * 6) % (f"{e}/{last}", "1.93G", *mloss, 37, 416)
                     + ("%10.4g" * 7) % results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _results_csv(path: Path, losses: np.ndarray) -> Path:
    """The same run as v6.0 writes it, ``results.csv`` (columns right-aligned)."""
    n = len(losses)
    lines = [",".join(f"{h:>20}" for h in CSV_HEADER)]
    for e, (box, obj, cls, vbox, vobj, vcls) in enumerate(losses):
        row = (e, box, obj, cls, 0.5, 0.6, min(0.9, 0.1 + e / n), min(0.6, 0.05 + e / (2 * n)),
               vbox, vobj, vcls, 0.01, 0.01, 0.01)
        lines.append(",".join(f"{x:>20.4g}" for x in row))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _verdicts(job: Job) -> list[tuple[str, str]]:
    now = job.last_time()
    assert now is not None
    return sorted((f.rule, f.severity.value) for f in evaluate([job], Policy(), now))


def test_results_txt_is_read_with_the_names_results_csv_gives(tmp_path: Path) -> None:
    path = _results_txt(tmp_path / "runs" / "train" / "exp2" / "results.txt", _losses(60),
                        epochs=100)
    assert detect_format(path) == "yolov5_txt"
    job = load_run(path)
    assert job.clock == "step"
    assert job.planned_steps == 99  # "59/99": the last epoch is 99
    assert set(job.series) >= {"train/box_loss", "train/obj_loss", "train/cls_loss",
                               "val/box_loss", "metrics/mAP_0.5"}
    box = job.series["train/box_loss"]
    assert box.step.tolist() == list(range(60))
    assert box.value[0] == pytest.approx(0.1, abs=1e-4)


def test_a_run_reads_and_is_judged_alike_in_either_file(tmp_path: Path) -> None:
    """The same healthy run, then the same run diverging (NaN training losses from epoch
    40), as ``results.txt`` and as ``results.csv``: the same findings."""
    for name, losses in (("healthy", _losses(60)), ("nan", _losses(60, diverge_at=40))):
        txt = load_run(_results_txt(tmp_path / name / "results.txt", losses))
        csv = load_run(_results_csv(tmp_path / name / "results.csv", losses))
        np.testing.assert_allclose(txt.series["train/obj_loss"].value,
                                   csv.series["train/obj_loss"].value, rtol=1e-3)
        assert _verdicts(txt) == _verdicts(csv)
    assert ("divergence", "critical") in _verdicts(txt)
    assert not [v for v in _verdicts(load_run(tmp_path / "healthy" / "results.txt"))
                if v[1] != "info"]


def test_a_txt_of_other_numbers_stays_text(tmp_path: Path) -> None:
    """Fifteen numbers a line without YOLOv5's ``epoch/last memory`` start are not this
    format, nor is a results.txt of prose."""
    numbers = tmp_path / "numbers.txt"
    numbers.write_text(" ".join(["1.0"] * 15) + "\n")
    prose = tmp_path / "results.txt"
    prose.write_text("epoch 3 loss 0.25\n")
    assert detect_format(numbers) == "text"
    assert detect_format(prose) == "text"


def test_a_line_of_another_layout_names_the_file_and_line(tmp_path: Path) -> None:
    path = _results_txt(tmp_path / "results.txt", _losses(5))
    lines = path.read_text().splitlines()
    lines[3] = lines[3].rsplit(maxsplit=1)[0]  # a field short
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(FormatError) as err:
        load_run(path)
    assert str(path) in str(err.value) and ":4" in str(err.value)
    assert "expected 15 fields" in str(err.value)


def test_a_last_line_still_being_written_is_left_for_the_next_read(tmp_path: Path) -> None:
    path = _results_txt(tmp_path / "results.txt", _losses(5))
    text = path.read_text()
    path.write_text(text + text.splitlines()[0][:30])
    assert len(load_run(path).series["train/box_loss"]) == 5
