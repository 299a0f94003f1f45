"""The text reader's default definitions on the log lines of widely used training scripts,
as they print them (written here line for line in their shape), and on a log that begins
with its script's source.

Seen on held-out public logs (bench/heldout_runs.csv): Karpathy's nanoGPT
(``iter 10: loss 4.5735, time ...``; ``step 0: train loss 6.06, val loss 6.05``) gave
no data; ``step 1/5000 | lr ... | loss 11.3`` gave steps and no loss; ``step 0 | loss:
11.08`` and ``Step 10 | Loss: 66.08`` gave losses with no step; a modded-nanogpt record,
which holds its training script above its log, gave a validation loss of 0.0 (from
``val_loss = 0.0``) and 0.4 (from an f-string's ``{val_loss:.4f}``) before its real ones.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from trainguard.adapters.local import load_run
from trainguard.adapters.local.definitions import MetricDefinition
from trainguard.checker import Policy, evaluate
from trainguard.checker.model import Job, Severity


def _read(tmp_path: Path, text: str, name: str = "train.log") -> Job:
    path = tmp_path / name
    path.write_text(text)
    job = load_run(path)
    assert isinstance(job, Job)
    return job


def _series(job: Job, name: str) -> tuple[list[float], list[float]]:
    s = job.series[name]
    return s.step.tolist(), s.value.tolist()


def test_karpathy_nanogpt(tmp_path: Path) -> None:
    job = _read(tmp_path, (
        "step 0: train loss 6.0601 BPC, val loss 6.0586 BPC\n"
        "iter 0: loss 6.0659 BPC, time 254533.85ms, mfu -100.00%\n"
        "iter 10: loss 4.5735, time 267.36ms, mfu 8.92%\n"
        "iter 20: loss 3.9673, time 261.53ms, mfu 8.94%\n"
        "step 20: train loss 3.8012, val loss 3.9011\n"
        "saving checkpoint to out\n"))
    assert _series(job, "loss") == ([0, 10, 20], [6.0659, 4.5735, 3.9673])
    assert _series(job, "train_loss") == ([0, 20], [6.0601, 3.8012])
    assert _series(job, "val_loss") == ([0, 20], [6.0586, 3.9011])


@pytest.mark.parametrize(("lines", "steps", "losses"), [
    # Karpathy's build-nanogpt
    ("step     0 | loss: 11.087302 | lr 8.3916e-07 | norm: 23.1795 | dt: 22621.26ms\n"
     "step     1 | loss: 10.974887 | lr 1.6783e-06 | norm: 22.6508 | dt: 704.72ms\n",
     [0, 1], [11.087302, 10.974887]),
    ("Step 10 | Loss: 66.0893\nStep 20 | Loss: 50.7591\n", [10, 20], [66.0893, 50.7591]),
    ("step     1/5000 | lr 1.493e-06 | loss 11.3191 | tok/s 1965.8\n"
     "step    50/5000 | lr 7.463e-05 | loss 9.8108 | tok/s 3585.9\n", [1, 50], [11.3191, 9.8108]),
    ("step 0, loss: 10.899394989013672\nstep 1, loss: 10.719036102294922\n",
     [0, 1], [10.899394989013672, 10.719036102294922]),
    # ``logger.info(f"step {step} loss {loss:.4f}")`` under Python logging's default
    # format and under an ISO timestamp: no step and no loss were read from either
    ("2024-05-01 10:00:00,123 - train - INFO - step 100 loss 2.3000\n"
     "2024-05-01 10:00:09,881 - train - INFO - step 200 loss 2.1000\n", [100, 200], [2.3, 2.1]),
    ("2024-05-01T10:00:00 iter 100 loss 2.3\n2024-05-01T10:00:09 iter 200 loss 2.1\n",
     [100, 200], [2.3, 2.1]),
])
def test_step_and_loss_separated_by_spaces_or_bars(
        tmp_path: Path, lines: str, steps: list[float], losses: list[float]) -> None:
    assert _series(_read(tmp_path, lines), "loss") == (steps, losses)


def test_the_swin_loggers_tab_separated_fields(tmp_path: Path) -> None:
    """The Swin Transformer's logger (VMamba's and many image models' since): each field
    after a tab, a running average in brackets after each value. Its loss was not read,
    and the log was "no data"."""
    head = "[2024-07-27 03:32:{} vssm1] (main.py 295): INFO Train: [29/300][{}/2859]\t"
    fields = ("eta 0:01:24 lr 0.000872\t wd 0.0500\ttime 0.4283 (0.4481)\tdata time "
              "0.0008 (0.0122)\tloss {} (1.9972)\tgrad_norm 4.1605 (inf)\tmem 16138MB\n")
    job = _read(tmp_path, "".join(head.format(sec, it) + fields.format(loss)
                                  for sec, it, loss in ((50, 2670, "2.0148"),
                                                        (55, 2680, "2.1019"))))
    assert job.series["loss"].value.tolist() == [2.0148, 2.1019]
    assert job.clock == "wall"


def test_a_loss_mentioned_in_a_sentence_is_no_record(tmp_path: Path) -> None:
    job = _read(tmp_path, (
        "Effective tokens per optimizer step: 18432\n"
        "step 1/400 | loss 10.940292 | lr 3.00e-04\n"
        "New best loss 10.940292 -> saved: out/best.pt\n"
        "step 2/400 | loss 9.398620 | lr 3.00e-04\n"))
    assert _series(job, "loss") == ([1, 2], [10.940292, 9.398620])
    assert job.series["step"].step.tolist() == [1, 2]  # not 18432 first


def test_a_log_that_begins_with_its_scripts_source(tmp_path: Path) -> None:
    """As a modded-nanogpt record: the script, a rule of =, then the log."""
    job = _read(tmp_path, (
        "import os\n"
        "class Muon(torch.optim.Optimizer):\n"
        "    def __init__(self, params, lr=3e-4, momentum=0.95, nesterov=True):\n"
        "optimizer2 = Muon(raw_model.transformer.h.parameters(), lr=0.1*args.learning_rate)\n"
        "        val_loss = 0.0\n"
        "        val_loss += loss\n"
        "            print(f'step:{step}/{args.n} val_loss:{val_loss:.4f} train_time:{t:.0f}ms')\n"
        + "=" * 100 + "\n"
        "step:0/100 val_loss:10.9264 train_time:285ms step_avg:nanms\n"
        "step:1/100 train_loss:10.9184 train_time:9000ms step_avg:nanms\n"
        "step:2/100 train_loss:8.6834 train_time:9500ms step_avg:nanms\n"
        "step:2/100 val_loss:8.2017 train_time:9600ms step_avg:500.00ms\n"), name="rec.txt")
    assert _series(job, "val_loss") == ([0, 2], [10.9264, 8.2017])
    assert "lr" not in job.series
    assert any("val_loss = 0.0" in line.text for line in job.logs)


def test_key_value_lines_that_look_like_assignments_are_still_read(tmp_path: Path) -> None:
    job = _read(tmp_path, "epoch = 3, loss = 0.5\nepoch = 4, loss = 0.25\nloss=0.125\n")
    assert job.series["loss"].value.tolist() == [0.5, 0.25, 0.125]
    assert job.series["epoch"].value.tolist() == [3, 4]


def test_a_number_with_a_unit_stuck_to_it_is_not_read_in_part(tmp_path: Path) -> None:
    """``12.5ms`` was read as 12 (and ``{x:.4f}`` as 0.4); a sentence's full stop is fine."""
    job = _read(tmp_path, "step=1 loss: 2.5.\nstep=2 loss=12.5ms\nstep=3 loss: 1.5\n")
    assert _series(job, "loss") == ([1, 3], [2.5, 1.5])


def test_an_indented_assignment_is_read_in_a_log_that_holds_no_source(tmp_path: Path) -> None:
    job = _read(tmp_path, "epoch 1\n    loss = 0.5\nepoch 2\n    loss = 0.25\n")
    assert job.series["loss"].value.tolist() == [0.5, 0.25]


def test_a_configuration_printed_whole_is_no_record(tmp_path: Path) -> None:
    """A script prints its settings before training: argparse's Namespace on one line, the
    Hugging Face Trainer's ``TrainingArguments(`` one field a line, OLMo's ``TrainConfig``.
    Their ``learning_rate=7e-05`` was read as the run's first learning rate, before the
    warm-up's first logged rate, and so hid the warm-up (``metrics.warming_up``)."""
    job = _read(tmp_path, (
        "arg is Namespace(config='train.yaml', lr=0.0001, epochs=3)\n"
        "TrainingArguments(\n"
        "_n_gpu=1,\n"
        "learning_rate=7e-05,\n"
        "logging_steps=10,\n"
        ")\n"
        "TrainConfig(run_name='x', optimizer=OptimizerConfig(learning_rate=0.0003))\n"
        "{'loss': 2.51, 'learning_rate': 2.3e-05, 'epoch': 0.01}\n"
        "{'loss': 2.43, 'learning_rate': 4.6e-05, 'epoch': 0.02}\n"
        "{'loss': 2.40, 'learning_rate': 7e-05, 'epoch': 0.03}\n"))
    assert job.series["lr"].value.tolist() == [2.3e-05, 4.6e-05, 7e-05]
    assert job.series["loss"].value.tolist() == [2.51, 2.43, 2.40]


def test_a_global_step_beside_an_epochs_batch_counter_is_the_step(tmp_path: Path) -> None:
    """A held-out GPT-2 log: ``[Epoch 001][Step 0240/1200] global_step=1440``. The batch
    counter of each epoch was read as the step: each new epoch looked like a restart, 1,225
    of its records were set aside and the rest of the run was one long stall."""
    lines = [f"[2025-10-28 16:{e * 10 + b:02d}:00][Epoch {e:03d}][Step {b * 10:04d}/30] "
             f"global_step={e * 30 + b * 10} train_loss={5 - 0.1 * (e * 3 + b):.4f} "
             "lr=0.0006\n" for e in range(3) for b in range(1, 4)]
    job = _read(tmp_path, "".join(lines))
    assert job.superseded == 0
    assert _series(job, "train_loss")[0] == [10, 20, 30, 40, 50, 60, 70, 80, 90]


def test_build_nanogpt_log_file(tmp_path: Path) -> None:
    """The log file of Karpathy's build-nanogpt (``f.write(f"{step} train {loss:.6f}\\n")``,
    and ``val``/``hella`` lines at each evaluation): three held-out runs gave no data."""
    job = _read(tmp_path, "0 val 11.7486\n0 hella 0.2439\n0 train 11.748396\n"
                "1 train 11.720709\n2 train 10.9\n250 val 6.2\n250 hella 0.25\n", "log.txt")
    assert _series(job, "loss") == ([0, 1, 2], [11.748396, 11.720709, 10.9])
    assert _series(job, "val_loss") == ([0, 250], [11.7486, 6.2])
    assert _series(job, "hella")[1] == [0.2439, 0.25]
    assert "train_loss" not in job.series


def test_a_number_then_a_word_then_a_number_in_other_text_is_no_record(tmp_path: Path) -> None:
    """The build-nanogpt lines are read whole: "3 train 2.5 s" or "12 val loss" are not."""
    job = _read(tmp_path, "3 train 2.5 s later\n12 val loss\nstep 5 loss 2.0\n")
    assert set(job.series) == {"step", "loss"}
    assert _series(job, "loss") == ([5], [2.0])


def test_a_clock_only_the_set_up_lines_carry_is_not_the_steps_clock(tmp_path: Path) -> None:
    """nanochat's log stamps its ``logging`` lines and prints its steps: the 21,400 steps
    of a 5.5-hour pre-training were all dated to the stamp before them (a stall of 387
    minutes as of the last record). A log whose step lines are stamped keeps its clock,
    and so does one that stamps a step line and prints the loss under it."""
    banner = "2025-10-23 16:42:00,037 - nanochat.common - INFO - world size: 8\n"
    printed = _read(tmp_path, banner + "".join(
        f"step {s:05d}/400 | loss: {3 - s / 400:.4f}\n" for s in range(300))
        + "2025-10-23 22:20:00,000 - nanochat.checkpoint_manager - INFO - saved\n")
    assert printed.clock == "step"
    assert _series(printed, "loss")[0][-1] == 299
    stamped = _read(tmp_path, "".join(
        f"2025-10-23 16:{s // 60:02d}:{s % 60:02d},000 - INFO - step {s}\n"
        f"  loss: {3 - s / 400:.4f}\n" for s in range(120)), "stamped.log")
    assert stamped.clock == "wall"
    steps, _ = _series(stamped, "loss")
    times = stamped.series["loss"].time
    assert steps[:3] == [0, 1, 2] and times[61] - times[1] == 60.0


def test_torchtitan_lines_in_terminal_colours(tmp_path: Path) -> None:
    """torchtitan colours its fields; through ``tee`` the escapes reach the file and the key
    ran on from the escape's letter (``\\x1b[32mloss``): three held-out runs gave no data."""
    line = ("[rank0]:[titan] 2026-04-18 22:15:44,378 - root - INFO - \x1b[31mstep: {s:2d}  "
            "\x1b[32mloss: {loss:.5f}  \x1b[38;2;180;60;0mgrad_norm:  9.8978  \x1b[34mtps: "
            "70,593\x1b[39m\n")
    job = _read(tmp_path, "".join(line.format(s=s, loss=12 - s / 10) for s in (1, 10, 20)))
    assert _series(job, "loss") == ([1, 10, 20], [11.9, 11.0, 10.0])


def test_a_timestamp_after_a_launchers_tags_is_the_clock(tmp_path: Path) -> None:
    """torchtitan writes ``[rank0]:[titan] 2026-04-19 12:18:01,628 - root - INFO - step: 10
    loss: ...`` and Megatron `` [2025-03-01 10:00:01] iteration ...``: the time after the
    blanks and tags was unread, so a hang on such a log was a silence on the steps, which
    `check` and `replay` cannot measure. A tag followed by a date that is data, and a
    bracketed timestamp with a T in it, read as before."""
    line = ("[rank0]:[titan] 2026-04-19 12:{m:02d}:01,628 - root - INFO - step: {s:2d}  "
            "loss: {loss:.4f}\n")
    job = _read(tmp_path, "".join(line.format(m=s, s=s, loss=9 - s / 10) for s in range(1, 6)))
    assert job.clock == "wall"
    assert np.diff(job.series["loss"].time).tolist() == [60.0] * 4
    mega = (" [2025-03-01 10:00:0{s}] iteration        {s}/   15535 | lm loss: {loss:E} |\n")
    job = _read(tmp_path, "".join(mega.format(s=s, loss=12.2 - s / 1e3) for s in range(1, 6)),
                "megatron.log")
    assert job.clock == "wall" and np.diff(job.series["loss"].time).tolist() == [1.0] * 4
    iso = "".join(f"[2025-03-01T10:00:0{s}] step {s} loss {3 - s / 10}\n" for s in range(1, 6))
    job = _read(tmp_path, iso, "iso.log")
    assert np.diff(job.series["loss"].time).tolist() == [1.0] * 4


def test_megatrons_learning_rate_is_the_lr(tmp_path: Path) -> None:
    """Megatron-LM prints ``learning rate: 2.000000E-07`` (a space, not an underscore): a
    held-out run's warm-up went unseen and its first five flat losses were "not learning"."""
    line = (" [2025-03-01 10:00:0{s}] iteration        {s}/   15535 | consumed samples: {c} | "
            "learning rate: {lr:E} | global batch size:   336 | lm loss: {loss:E} |\n")
    job = _read(tmp_path, "".join(line.format(s=s, c=336 * s, lr=2e-7 * s, loss=12.2 - s / 1e3)
                                  for s in range(1, 6)))
    assert _series(job, "lr")[1] == pytest.approx([2e-7 * s for s in range(1, 6)])
    assert job.planned_steps == 15535


_KERAS_EPOCH = ("{n}/{n} [==============================] - {s}s 11ms/step - loss: {loss} - "
                "accuracy: {acc} - val_loss: {vloss} - val_accuracy: {vacc}")


def _keras_log(losses: list[float], accuracy: float, seconds: int = 21,
               running: bool = False, backspaces: bool = False) -> str:
    """Keras's console output (``model.fit(verbose=1)``) as a file receives it: "Epoch
    N/M", then, with ``running``, the progress bar's updates (running means over the
    epoch so far) a line each, or written over with backspaces and a carriage return."""
    out = []
    for e, loss in enumerate(losses, 1):
        parts = []
        if running:
            parts += [f"  {b}/1875 [=====>........................] - ETA: 1:0{b % 10} - "
                      f"loss: {loss * 3:.4f} - accuracy: 0.5000" for b in (1, 32, 900)]
        parts.append(_KERAS_EPOCH.format(n=1875, s=seconds, loss=f"{loss:.4f}",
                                         acc=f"{accuracy:.4f}", vloss=f"{loss:.4f}",
                                         vacc=f"{accuracy:.4f}"))
        sep = "\b" * 60 + "\r" if backspaces else "\n"
        out.append(f"Epoch {e}/{len(losses)}\n" + sep.join(parts) + "\n")
    return "".join(out)


@pytest.mark.parametrize("shape", ["epoch lines", "running means", "backspaces"])
def test_keras_console_output_is_one_record_per_epoch(tmp_path: Path, shape: str) -> None:
    """The records of a Keras console log are the epochs' own lines, at the epoch
    they follow, with the accuracy; its time axis is the sum of the epochs' durations, and
    it planned the epochs "Epoch N/M" names. The progress bar's running means (about the
    first batches, three times the epoch's loss here) are no records: read as records
    they would look like a loss that jumps back up at each epoch's start."""
    text = _keras_log([0.9, 0.5, 0.3], 0.8, running=shape != "epoch lines",
                      backspaces=shape == "backspaces")
    path = tmp_path / "fit.log"
    path.write_bytes(text.encode())
    job = load_run(path)
    assert isinstance(job, Job)
    assert _series(job, "loss") == ([1, 2, 3], [0.9, 0.5, 0.3])
    assert _series(job, "val_accuracy") == ([1, 2, 3], [0.8, 0.8, 0.8])
    assert _series(job, "accuracy")[1] == [0.8, 0.8, 0.8]
    assert job.clock == "elapsed"
    assert job.series["loss"].time.tolist() == [21, 42, 63]
    assert job.planned_steps == 3


@pytest.mark.parametrize("line", [
    "1875/1875 - 21s - loss: 0.9000 - val_loss: 0.9000",  # verbose=2
    "60000/60000 [==============================] - 21s - loss: 0.9000 - val_loss: 0.9000",
    "1875/1875 ━━━━━━━━━━━━━━━━━━━━ 21s 3ms/step - loss: 0.9000 - val_loss: 0.9000",  # Keras 3
])
def test_keras_epoch_lines_of_each_version_carry_the_epochs_duration(
        tmp_path: Path, line: str) -> None:
    job = _read(tmp_path, f"Epoch 1/2\n{line}\nEpoch 2/2\n{line}\n")
    assert _series(job, "loss") == ([1, 2], [0.9, 0.9])
    assert job.series["val_loss"].time.tolist() == [21, 42]


def test_keras_console_log_at_chance_is_not_learning(tmp_path: Path) -> None:
    """Five epochs at ln 10 with accuracy 0.1, as a ten-class model that learns nothing
    prints them: the plateau rule names the chance level, with the accuracy it read."""
    job = _read(tmp_path, _keras_log([2.3027, 2.3025, 2.3026, 2.3026, 2.3024], 0.1,
                                      running=True))
    now = float(job.series["loss"].time[-1])
    found = [f for f in evaluate([job], Policy(), now) if f.rule == "plateau"]
    assert found and "chance level ln 10" in found[0].message
    assert "accuracy 0.1" in found[0].message


def test_an_epoch_line_does_not_replace_the_steps_a_log_counts(tmp_path: Path) -> None:
    """A log that prints "Epoch 2/20" and counts its own steps keeps them: the epoch
    number is no step there (it would send the step back at each epoch)."""
    job = _read(tmp_path, "Epoch 1/2\nstep 100 loss 2.0\nstep 200 loss 1.5\n"
                          "Epoch 2/2\nstep 300 loss 1.2\n")
    assert _series(job, "loss") == ([100, 200, 300], [2.0, 1.5, 1.2])
    assert job.planned_steps is None or job.planned_steps != 2


def test_a_loop_that_counts_epochs_and_batches_is_judged_by_epoch(tmp_path: Path) -> None:
    """``Epoch: 3, Batch: 10, Loss: 0.5`` with no step: each record's step is its epoch,
    as a CSV log with an epoch column and no step."""
    job = _read(tmp_path, "".join(f"Epoch: {e}, Batch: {b}, Loss: {1 / (e + b + 1):.4f}\n"
                                  for e in (1, 2) for b in (0, 10)))
    assert job.series["loss"].step.tolist() == [1, 1, 2, 2]


def test_a_loss_whose_side_a_word_names_is_that_sides(tmp_path: Path) -> None:
    """A hand-written loop's "Validation Loss: 0.0073" on a line of its own is the
    held-out loss; read as "loss" it sat among the batches' losses, a tenth of them, and
    made the training loss look as if it jumped down and back at each epoch."""
    job = _read(tmp_path, (
        "Epoch: 1, Batch: 0, Loss: 0.3615\n"
        "Epoch: 1, Batch: 10, Loss: 0.0322\n"
        "Epoch 1 - Average Training Loss: 0.0239\n"
        "Validation Loss: 0.0073\n"
        "Test Loss: 0.0081\n"
        "Epoch: 2, Batch: 0, Loss: 0.0158\n"))
    assert job.series["loss"].value.tolist() == [0.3615, 0.0322, 0.0158]
    assert job.series["val_loss"].value.tolist() == [0.0073]
    assert job.series["test_loss"].value.tolist() == [0.0081]
    assert job.series["train_loss"].value.tolist() == [0.0239]
    assert job.series["loss"].step.tolist() == [1, 1, 2]


def test_a_loops_own_n_of_m_line_is_its_record(tmp_path: Path) -> None:
    """"3/10 - 12s - loss: 0.41" with no Keras "Epoch N/M" line before it is a loop's
    record of its epoch 3, not a progress bar's running mean to skip."""
    job = _read(tmp_path, "".join(f"{e}/3 - 12s - loss: {1 / e:.4f}\n" for e in (1, 2, 3)))
    assert job.series["loss"].value.tolist() == [1.0, 0.5, 0.3333]


def test_a_step_counter_that_starts_again_each_epoch_goes_on(tmp_path: Path) -> None:
    """``Epoch 1 | Step 0/30 | Loss: ...`` after ``Epoch 0 | Step 20/30``: the step counts
    the epoch's batches. Read as it is, epoch 1's points sorted among epoch 0's on the step
    axis, and the later session seemed to rewrite the first: a healthy fine-tune was called
    not learning. Its steps go on from the last of the epoch before, one logging interval
    later; "/30" was the epoch's plan, not the run's."""
    lines = "".join(f"INFO:__main__:Epoch {e} | Step {s:4d}/30 | Loss: "
                    f"{2.0 / (1 + e * 3 + s / 10):.4f}\n" for e in (0, 1, 2) for s in (0, 10, 20))
    job = _read(tmp_path, lines)
    assert job.series["loss"].step.tolist() == [0, 10, 20, 30, 40, 50, 60, 70, 80]
    assert job.superseded == 0 and job.planned_steps is None
    # the same with a log's own definitions, which name no epoch
    path = tmp_path / "own.log"
    path.write_text(lines)
    own = load_run(path, [MetricDefinition("step", r"Step\s+(\d+)/\d+ \|"),
                          MetricDefinition("loss", r"\| Loss: (\S+)")])
    assert isinstance(own, Job)
    assert own.series["loss"].step.tolist() == [0, 10, 20, 30, 40, 50, 60, 70, 80]


def test_a_run_resumed_from_its_checkpoint_keeps_its_steps(tmp_path: Path) -> None:
    """A step that goes back with its epoch is a resume (the sessions' business), and a
    global step that goes on across epochs is left as it is."""
    resumed = _read(tmp_path, "Epoch 1 | step 100 | loss: 2.0\nEpoch 2 | step 200 | loss: 1.5\n"
                              "Epoch 1 | step 100 | loss: 2.0\nEpoch 2 | step 200 | loss: 1.4\n")
    assert sorted(resumed.series["loss"].step.tolist()) == [100, 200]
    going_on = _read(tmp_path, "Epoch 1 | step 100 | loss: 2.0\nEpoch 1 | step 200 | loss: 1.5\n"
                               "Epoch 2 | step 300 | loss: 1.2\n", name="on.log")
    assert going_on.series["loss"].step.tolist() == [100, 200, 300]


def test_whose_loss_and_accuracy_a_word_names_across_a_word_between(tmp_path: Path) -> None:
    """A loop's "Iter: 200, train loss: ..., val loss: ..." and, at each epoch's end,
    "val epoch loss:0.34723": no "val epoch loss" among the training losses (read as the
    loss, its 30 points stood for the training objective of a run with 540), and each
    accuracy on its side."""
    job = _read(tmp_path, (
        "INFO - 2020/03/07 01:31 -- 0:00:20 - Iter: 200, train loss: 0.32974, train "
        "accuracy: 0.92, val loss: 0.44704, val accuracy: 0.8636\n"
        "INFO - 2020/03/07 01:34 -- 0:02:53 - 0th epoch finished, val epoch loss:0.34723, "
        "val epoch accuracy:0.89258\n"
        "INFO - 2020/03/07 01:35 -- 0:03:02 - Iter: 300, train loss: 0.27372, train "
        "accuracy: 0.89, val loss: 0.29609, val accuracy: 0.9044\n"))
    assert _series(job, "loss") == ([200, 300], [0.32974, 0.27372])
    assert _series(job, "val_loss") == ([200, 300], [0.44704, 0.29609])
    assert _series(job, "train_accuracy")[1] == [0.92, 0.89]
    assert _series(job, "val_accuracy")[1] == [0.8636, 0.9044]
    assert "accuracy" not in job.series


def test_a_launchers_lone_step_banner_is_no_step_counter(tmp_path: Path) -> None:
    """DeepSpeed's stamped "[Rank 0] step=0, skipped=0" once at the start, then the
    Hugging Face Trainer's dicts, unstamped and with no step: the banner's step and time
    are no clock for the dicts (carried on, the run sat at step 0 from 00:29 and was a
    critical stall two hours later). The dicts' epochs are their steps, on a step clock."""
    job = _read(tmp_path, (
        "[2025-02-16 00:29:01,869] [INFO] [logging.py:96:log_dist] [Rank 0] step=0, "
        "skipped=0, lr=[0.0]\n"
        + "".join(f"{{'loss': {10 - e:.1f}, 'grad_norm': 1.2, 'learning_rate': 1e-05, "
                  f"'epoch': {e / 100:.2f}}}\n" for e in range(1, 6))
        + "[2025-02-16 03:56:45,226] [INFO] [launch.py:351:main] Process 3752006 exits "
          "successfully.\n"))
    assert job.clock == "step"
    assert job.series["loss"].step.tolist() == [0.01, 0.02, 0.03, 0.04, 0.05]


def test_a_built_in_definition_matches_no_line_without_its_needle() -> None:
    """Each built-in definition names a text its lines hold, and lines without it are not
    searched (a search per definition per line was most of the time spent reading a
    log). A needle a matching line lacks would lose records: every built-in definition
    is searched on every line of the shared corpora's text logs and of lines written here
    in the shapes of the tests above, and never matches one without its needle."""
    from tests.corpora import CURVES, RUNS
    from trainguard.adapters.local.definitions import DEFAULT_DEFINITIONS

    lines = [
        "step:125/1750 val_loss:4.0123 train_time:51345ms step_avg:415.2ms",
        "iter 10: loss 4.5735, time 267.36ms, mfu 8.92%",
        "step     1/5000 | lr 1.493e-06 | loss 11.3191 | tok/s 1965.8",
        "Step 10 | Loss: 66.0893", "[Epoch 001][Step 0240/1200] global_step=1440 loss=0.5",
        "Iter(train) [  50/20000]  lr: 1.0e-04  loss: 0.8", "Epoch(train) [3][10/50] loss: 1",
        "{'loss': 2.1095, 'grad_norm': 1.19, 'learning_rate': 3.4e-05, 'epoch': 0.05}",
        "Epoch: 1, Batch: 10, Loss: 0.0322", "Validation Loss: 0.0073", "Test Loss: 0.0081",
        "INFO - Iter: 200, train loss: 0.32974, train accuracy: 0.92, val loss: 0.44704",
        "1875/1875 - 21s - loss: 0.29 - accuracy: 0.91 - val_loss: 0.31 - val_accuracy: 0.9",
        "| norm: 0.2843 | dt: 22621.26ms", "19072 train 3.021431", "250 hella 0.2951",
        "trainguard: step=100/1000 loss=2.5 val_loss=2.7 t=12.5",
        "trainguard: pause phase=eval elapsed=30", "[step=1/15000,epoch=0]",
        "    train/CrossEntropyLoss=2.998", " iteration   1/ 500 | lm loss: 1.26E+01 |",
    ]
    for root in (RUNS, CURVES):
        for path in sorted(root.rglob("*.log"))[:12] + sorted(root.rglob("*.txt"))[:12]:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines += [line for _, line in zip(range(1500), f, strict=False)]
    assert len(lines) >= 20
    for d in DEFAULT_DEFINITIONS:
        if not d.needle:
            continue
        rx = d.compile()
        missed = [line for line in lines if d.needle not in line and rx.search(line)]
        assert not missed, (d.name, d.needle, missed[:3])


def test_an_epoch_named_once_by_an_evaluation_dates_no_step_lines(tmp_path: Path) -> None:
    """A trainer that logs "[INFO] loss: 2.86, grad_norm: 21.1" each step with no step,
    and an evaluation's dict with 'epoch': 3.0 once at its end: the epoch counts nothing
    (read as the lines' epoch, 9,588 losses sat at one step and a replay stopped the
    healthy run as a two-hour stall). Its records keep no step, on its stamps."""
    lines = "".join(f"[2025-07-07 12:{m:02d}:00,000] INFO: [INFO] loss: {2.8 - m / 100:.4f}, "
                    f"grad_norm: 1.5\n" for m in range(50))
    job = _read(tmp_path, lines + "[2025-07-07 12:50:00,000] INFO: Eval Metrics: "
                "{'eval_loss': 1.32, 'epoch': 3.0}\n")
    assert job.clock == "wall"
    assert np.isnan(job.series["loss"].step).all() and "step" not in job.series


def test_a_trainers_fractional_epochs_date_their_own_lines_in_order(tmp_path: Path) -> None:
    """The Hugging Face Trainer's console: "{'loss': 2.9, ..., 'epoch': 0.01}" with no
    step, the epoch rounded to 0.01, so three or four lines print each value. Each record
    is in its own line's epoch (not the line before's: the first record had none), and
    lines that print the same one are spread up to the next, in order, as its steps were;
    a tqdm bar between them keeps the step of the line before it."""
    lines = []
    for i in range(1, 41):
        lines.append(f" {i}%|##| {i}/400 [00:{i:02d}<10:00,  1.00s/it]\n")
        lines.append(f"{{'loss': {3.0 - i / 40:.4f}, 'grad_norm': 1.5, "
                     f"'learning_rate': 5e-05, 'epoch': {round(i / 300, 2)}}}\n")
    job = _read(tmp_path, "".join(lines))
    step = job.series["loss"].step
    assert len(step) == 40 and np.isfinite(step).all()
    assert step[0] == 0.0 and (np.diff(step) > 0).all()  # in order, none shared
    printed = np.array([round(i / 300, 2) for i in range(1, 41)])
    first = np.r_[True, printed[1:] != printed[:-1]]  # where a new value is printed
    assert np.array_equal(step[first], printed[first])  # each at its own line's epoch
    assert (step >= printed - 1e-12).all()


def test_whole_epochs_shared_by_a_loops_batches_are_not_spread(tmp_path: Path) -> None:
    """Integer epochs shared by an epoch's batch lines ("Epoch: 3, Batch: 10, Loss: ...")
    stay the batches' step: the plateau rule judges such a loop per epoch."""
    job = _read(tmp_path, "".join(f"Epoch: {e}, Batch: {b}, Loss: {2.0 - e / 10:.3f}\n"
                                  for e in range(1, 6) for b in range(0, 50, 10)))
    assert job.series["loss"].step.tolist() == [float(e) for e in range(1, 6) for _ in range(5)]


def test_a_keras_running_mean_gone_nan_is_a_record_before_the_epoch_ends(
        tmp_path: Path) -> None:
    """Keras's progress bar part-way through a 4-hour epoch: its running means are no
    records, but one that is NaN says a batch was (and the epoch's mean will be): that
    is read, so the divergence is found without waiting for the epoch's end."""
    bar = "[==>...........................]"
    lines = ["Epoch 1/10\n"] + [
        f"   {b}/1000 {bar} - ETA: 4:13:02 - loss: {0.9 - b / 100:.4f}\n" for b in range(1, 7)
    ] + [f"   {b}/1000 {bar} - ETA: 4:10:00 - loss: nan - rpn_loss: nan\n" for b in range(7, 14)]
    job = _read(tmp_path, "".join(lines))
    loss = job.series["loss"]
    assert len(loss) == 7 and np.isnan(loss.value).all()  # the finite means are no records
    found = evaluate([job], Policy(), 0.0)
    assert any(f.rule == "divergence" and f.severity is Severity.CRITICAL for f in found)


def test_a_keras_running_mean_gone_nan_keeps_the_epochs_clock(tmp_path: Path) -> None:
    """The NaN running mean is a record, not an epoch's end: the epochs' printed
    durations stay the clock (a running line once counted as an epoch of 0 s and the log
    lost its clock)."""
    bar, done = "[==>...........................]", "[==============================]"
    text = ("Epoch 1/10\n"
            f"   5/100 {bar} - ETA: 20s - loss: 0.9000\n"
            f"100/100 {done} - 21s 210ms/step - loss: 0.7000\n"
            "Epoch 2/10\n"
            f"   5/100 {bar} - ETA: 20s - loss: 0.6500\n"
            f"   6/100 {bar} - ETA: 20s - loss: nan\n"
            f"   7/100 {bar} - ETA: 20s - loss: nan\n")
    job = _read(tmp_path, text)
    loss = job.series["loss"]
    assert loss.value[0] == 0.7 and np.isnan(loss.value[1:]).all()
    assert job.clock != "step" and loss.time[0] > 0  # the first epoch's 21 s


@pytest.mark.parametrize(("lines", "steps", "losses"), [
    # detectron2's events writer: the loss is only "total_loss"
    ("[11/01 20:14:15 d2.utils.events]: eta: 5:41:49  iter: 379  total_loss: 1.707  "
     "loss_cls: 1.184  loss_box_reg: 0.475  time: 0.2293  lr: 0.003796  max_mem: 3782M\n"
     "[11/01 20:14:20 d2.utils.events]: eta: 5:41:40  iter: 399  total_loss: 1.652  "
     "loss_cls: 1.101  loss_box_reg: 0.469  time: 0.2291  lr: 0.003996  max_mem: 3782M\n",
     [379, 399], [1.707, 1.652]),
    # SSD (lufficc) and YOLOv3 in TensorFlow 2
    ("2021-02-18 16:34:15,442 SSD.trainer INFO: iter: 000010, lr: 0.00009, total_loss: "
     "24.441 (24.441), cls_loss: 21.283 (21.283), reg_loss: 3.157 (3.157)\n"
     "2021-02-18 16:34:45,442 SSD.trainer INFO: iter: 000020, lr: 0.00018, total_loss: "
     "20.110 (22.275), cls_loss: 17.001 (19.142), reg_loss: 3.109 (3.133)\n",
     [10, 20], [24.441, 20.110]),
    ("=> STEP  748   lr: 0.000598   giou_loss: 2.10   conf_loss: 6.18   total_loss: 8.31\n"
     "=> STEP  749   lr: 0.000599   giou_loss: 2.05   conf_loss: 6.01   total_loss: 8.07\n",
     None, [8.31, 8.07]),
    # a re-identification trainer's spaced fields: "loss_total 10.812"
    ("  Iter: [000/3877]   Freq 10.6   loss_target 0.000   loss_ml 13879.977   "
     "loss_total 10.812   [2020-04-17 18:04:08]\n"
     "  Iter: [010/3877]   Freq 11.2   loss_target 0.001   loss_ml 12011.002   "
     "loss_total 9.774   [2020-04-17 18:04:18]\n", None, [10.812, 9.774]),
    # a maskrcnn-benchmark user's loop: "losses : 39.66"
    ("iteration : 1, losses : 39.65670394897461\niteration : 2, losses : 31.2\n",
     [1, 2], [39.65670394897461, 31.2]),
    # mlx-lm's LoRA trainer
    ("Iter 10: Train loss 2.416, Learning Rate 1.000e-05, It/sec 3.374\n"
     "Iter 20: Train loss 2.118, Learning Rate 1.000e-05, It/sec 3.371\n",
     [10, 20], [2.416, 2.118]),
    # TRL's trainer prints its dict's values as strings
    ("{'loss': '3.412', 'grad_norm': '0.9297', 'learning_rate': '1.071e-05', 'epoch': "
     "'0.0179'}\n{'loss': '2.981', 'grad_norm': '0.8802', 'learning_rate': '2.142e-05', "
     "'epoch': '0.0358'}\n", [0.0179, 0.0358], [3.412, 2.981]),
    # a PyTorch tutorial's full-width colon (训练次数 is the step count, not read)
    ("训练次数：100, Loss：1.9817659854888916\n训练次数：200, Loss：1.81\n",
     None, [1.9817659854888916, 1.81]),
    # OpenNMT-py: the training cross-entropy is "xent"
    ("[2018-11-23 16:41:49,278 INFO] Step 50/100000; acc:   4.03; ppl: 42610.88; "
     "xent: 10.66; lr: 1.00000; 10579/15225 tok/s;      4 sec\n"
     "[2018-11-23 16:41:53,278 INFO] Step 100/100000; acc:   6.11; ppl: 3001.12; "
     "xent: 8.01; lr: 1.00000; 10602/15225 tok/s;      8 sec\n", [50, 100], [10.66, 8.01]),
])
def test_the_losses_of_detectors_and_trainers_by_other_names(
        tmp_path: Path, lines: str, steps: list[float] | None, losses: list[float]) -> None:
    """Each read as "no data" (or no loss) with the default definitions before: a user's
    ``trainguard check train.log`` found nothing to judge. Lines as the projects print
    them, written here; ``steps`` None where no step is read (the records' order is the
    step), as before."""
    got_steps, got = _series(_read(tmp_path, lines), "loss")
    assert got == losses
    if steps is not None:
        assert got_steps == steps


def test_a_component_named_total_is_not_read_over_the_loss(tmp_path: Path) -> None:
    """Where a line has its own "loss", a "total_loss" beside it does not replace it."""
    job = _read(tmp_path, "step 1 loss: 2.5 total_loss: 9.0\nstep 2 loss: 2.25 total_loss: 8.5\n")
    assert _series(job, "loss") == ([1, 2], [2.5, 2.25])


@pytest.mark.parametrize("held_out", [
    "Test Set : Mean loss: 0.4496, Test Accuracy : 98174/116323 (84.4%)",
    "2018-01-28 02:24:49,711 INFO    : Epoch [199]/[199] \t Validation Phase Loss: 0.0277",
    "INFO - 09/04/20 07:56:49 - 0:01:02 - Test:\tTime 4.750\tLoss 103.7909\tAcc@1 27.240",
    "Epoch(val) [1][50/500]  eta: 0:01:00  loss: 0.9001",
])
def test_a_held_out_loss_named_earlier_on_its_line_is_not_the_training_loss(
        tmp_path: Path, held_out: str) -> None:
    """A word before the key that says the line is about held-out data (Test, Validation,
    val...), not next to it: the training loss does not take the held-out values among
    its own (a SwAV linear probe's test loss of 103 beside a training loss of 6.8 read as
    a loss that "never improved on its first value")."""
    lines = "".join(f"step {i} loss: {2.0 / i:.4f}\n{held_out}\n" for i in range(1, 4))
    assert _series(_read(tmp_path, lines), "loss")[1] == [2.0, 1.0, 0.6667]


def test_the_mmcv_loggers_epoch_and_iteration(tmp_path: Path) -> None:
    """MMCV's logger (mmdetection 2.x, mmsegmentation 0.x...): ``Epoch [E][i/N]``, its
    iteration starting again each epoch. Neither was read before: the losses had no step
    and no epoch, and plateau could not take per-epoch medians."""
    line = ("2021-05-01 10:{m:02d}:00,000 - mmdet - INFO - Epoch [{e}][{i}/7330]\tlr: "
            "1.000e-02, eta: 1 day, 2:03:04, time: 0.512, data_time: 0.101, memory: 3000, "
            "loss_rpn_cls: 0.5012, loss_bbox: 0.4, loss: {v}\n")
    text = "".join(line.format(m=k, e=1 + k // 3, i=50 * (1 + k % 3), v=2.0 - 0.1 * k)
                   for k in range(9))
    job = _read(tmp_path, text)
    steps, losses = _series(job, "loss")
    assert losses == pytest.approx([2.0 - 0.1 * k for k in range(9)])
    assert steps[:3] == [50, 100, 150] and all(b > a for a, b in itertools.pairwise(steps))
    assert _series(job, "epoch")[1] == [1, 1, 1, 2, 2, 2, 3, 3, 3]


@pytest.mark.parametrize(("line", "epoch"), [
    ("Epoch [3/10] TrainLoss=1.37 ValLoss=1.21", 3),
    ("INFO - 09/04/20 07:56:54 - 0:01:06 - Epoch[1] - Iter: [0/13]\tLoss 98.9633", 1),
    ("2018-01-28 02:24:30,079 INFO    : Epoch [199]/[199] \t Training Phase Loss: 0.0375", 199),
])
def test_an_epoch_in_brackets(tmp_path: Path, line: str, epoch: int) -> None:
    job = _read(tmp_path, line + "\n")
    assert _series(job, "epoch")[1] == [epoch]


def test_mmcvs_validation_epoch_is_no_training_epoch(tmp_path: Path) -> None:
    job = _read(tmp_path, "Epoch(val) [3][500]\tbbox_mAP: 0.3710, bbox_mAP_50: 0.5800\n")
    assert "epoch" not in job.series


def test_a_grpo_trainers_reward_and_sanas_global_step(tmp_path: Path) -> None:
    """TRL's GRPO trainer prints its reward among its dict's keys (its collapse to 0 was
    missed on default reading: only the loss, 0.0 throughout, was read), and not DPO's
    ``rewards/chosen``; Sana's trainer its ``Global Step`` before a per-epoch one."""
    job = _read(tmp_path, (
        "{'loss': 0.0, 'grad_norm': 0.0, 'reward': 0.85, 'reward_std': 0.3, 'epoch': 0.01}\n"
        "{'loss': 0.0, 'grad_norm': 0.0, 'reward': 0.025, 'reward_std': 0.1, 'epoch': 0.02}\n"
        "{'loss': 0.69, 'rewards/chosen': 0.1, 'rewards/margins': 0.2, 'epoch': 0.03}\n"))
    assert _series(job, "reward")[1] == [0.85, 0.025]
    job = _read(tmp_path, (
        "2025-03-18 12:00:04 - [Sana] - INFO - Epoch: 2 | Global Step: 2516 | Local Step: "
        "639 // 1877, total_eta: 6:45:46, lr:4.330e-05, loss:0.1529\n"
        "2025-03-18 12:00:29 - [Sana] - INFO - Epoch: 2 | Global Step: 2526 | Local Step: "
        "649 // 1877, total_eta: 6:45:21, lr:4.330e-05, loss:0.1490\n"), "sana.log")
    assert _series(job, "loss") == ([2516, 2526], [0.1529, 0.1490])


@pytest.mark.parametrize(("lines", "steps", "epochs"), [
    # the Swin Transformer's logger: "Train: [epoch/epochs][iteration/iterations]"
    ("[2026-04-23 15:26:24 swin_tiny] (main.py 223): INFO Train: [0/300][0/390]\teta 0:22:23 "
     "lr 0.000000\t wd 0.0500\ttime 3.4458 (3.4458)\tloss 2.3847 (2.3847)\n"
     "[2026-04-23 15:26:27 swin_tiny] (main.py 223): INFO Train: [0/300][10/390]\teta 0:03:22 "
     "lr 0.000000\t wd 0.0500\ttime 0.2384 (0.5321)\tloss 2.3605 (2.3566)\n",
     [0, 10], [0, 0]),
    # LAVIS's (MiniGPT-4, BLIP-2): "epoch: [E]  [i/N]"
    ("Train: data epoch: [0]  [3950/5000]  eta: 0:08:37  lr: 0.000029  loss: 10.3750\n"
     "Train: data epoch: [0]  [4000/5000]  eta: 0:08:12  lr: 0.000029  loss: 10.3750\n",
     [3950, 4000], [0, 0]),
])
def test_an_epoch_and_its_iteration_in_brackets(
        tmp_path: Path, lines: str, steps: list[float], epochs: list[float]) -> None:
    """Read as the epoch alone, LAVIS's per-batch losses all sat at epoch 0 as one step,
    and MiniGPT-4's loss stuck at 10.375 (ln 32,000) was no longer found on default
    reading; the Swin logger's losses had no step at all."""
    job = _read(tmp_path, lines)
    assert _series(job, "loss")[0] == steps
    assert _series(job, "epoch")[1] == epochs


def test_paddlevideos_epoch(tmp_path: Path) -> None:
    job = _read(tmp_path, "[10/05 20:31:36] epoch:[  1/100] train step:10  loss: 3.33008 "
                          "lr: 0.006990 top1: 0.12285\n")
    assert _series(job, "epoch")[1] == [1]
