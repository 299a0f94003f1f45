"""Files of popular trainers, written in the test as each trainer writes them (the lines'
shapes copied from public runs: LLaMA-Factory's ``trainer_log.jsonl``, Detectron2's and
MMEngine's ``metrics.json``/``scalars.json``, the Hugging Face Trainer's console, a
nanoGPT-style ``[train] iter`` log, Megatron-LM's iteration lines), read by the real
readers.

Each was seen to fail on a public run: LLaMA-Factory's log was refused whole
("key 'elapsed_time': cannot read '0:32:48' as a number") and its steps (``current_steps``)
not read; Detectron2's per-iteration ``time`` (seconds per iteration) was taken for the
run's clock; 2 of the 175 losses a TRL console log prints were read (the key is quoted);
``[train] iter 10:`` and Megatron's leading-space ``iteration`` gave no steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainguard.adapters.local import FormatError, load_run
from trainguard.checker.model import Job


def _load(path: Path) -> Job:
    job = load_run(path)
    assert isinstance(job, Job)
    return job


def _llamafactory(n: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i in range(1, n + 1):
        elapsed = 1968 * i  # 32 min 48 s per 5 steps
        remaining = 1968 * (n - i) + 3 * 86400
        rows.append({
            "current_steps": 5 * i, "total_steps": 5 * n, "loss": round(2.35 - 0.01 * i, 4),
            "lr": 1e-5 * i / n, "epoch": i / n, "percentage": round(100 * i / n, 2),
            "elapsed_time": _timedelta(elapsed), "remaining_time": _timedelta(remaining)})
    return rows


def _timedelta(seconds: int) -> str:
    """As Python's ``str(timedelta(seconds=...))`` writes it."""
    days, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    clock = f"{h}:{m:02d}:{s:02d}"
    return f"{days} day{'s' if days > 1 else ''}, {clock}" if days else clock


def test_llamafactory_trainer_log(tmp_path: Path) -> None:
    path = tmp_path / "saves" / "trainer_log.jsonl"
    path.parent.mkdir()
    rows = _llamafactory(40)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = _load(path)
    assert job.planned_steps == 200
    assert job.clock == "elapsed"
    loss = job.series["loss"]
    assert loss.step.tolist() == [5.0 * i for i in range(1, 41)]
    # "0:32:48" is 1,968 s; the 40th record is "21:52:00", past a day's worth of "H:"
    assert np.diff(loss.time).tolist() == [1968.0] * 39
    assert loss.value[0] == pytest.approx(2.34)
    assert "remaining_time" not in job.series  # a text, not a metric


def test_llamafactory_durations_of_days_are_read(tmp_path: Path) -> None:
    path = tmp_path / "trainer_log.jsonl"
    path.write_text(
        json.dumps({"current_steps": 5, "loss": 2.0, "elapsed_time": "23:59:59"}) + "\n"
        + json.dumps({"current_steps": 10, "loss": 1.9, "elapsed_time": "1 day, 0:00:09"})
        + "\n" + json.dumps({"current_steps": 15, "loss": 1.8,
                             "elapsed_time": "2 days, 0:00:09"}) + "\n")
    t = _load(path).series["loss"].time
    assert (t - t[0]).tolist() == [0.0, 10.0, 86410.0]


def test_a_time_key_that_is_no_duration_names_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "trainer_log.jsonl"
    path.write_text(json.dumps({"current_steps": 5, "loss": 2.0, "elapsed_time": "0:32:48"})
                    + "\n" + json.dumps({"current_steps": 10, "loss": 1.9,
                                         "elapsed_time": "about an hour"}) + "\n")
    with pytest.raises(FormatError) as e:
        load_run(path)
    msg = str(e.value)
    assert str(path) in msg and ":2:" in msg and "'elapsed_time'" in msg
    assert "about an hour" in msg


def test_detectron2_time_per_iteration_is_no_clock(tmp_path: Path) -> None:
    """Detectron2 writes ``time`` (seconds per iteration, up and down) every 20
    iterations; MMEngine does the same in ``scalars.json``. It is no time axis: the run is
    on its steps, not on a clock that advances a fraction of a second per record."""
    rng = np.random.default_rng(0)
    path = tmp_path / "output" / "metrics.json"
    path.parent.mkdir()
    lines = [json.dumps({"data_time": 0.004, "eta_seconds": 99.0 - i, "iteration": 19 + 20 * i,
                         "loss_cls": 0.7 / (1 + i), "lr": 1.6e-5 * (i + 1),
                         "time": float(0.35 + rng.normal(0, 0.02)),
                         "total_loss": 2.1 / (1 + 0.3 * i)})
             for i in range(30)]
    path.write_text("\n".join(lines) + "\n")
    job = _load(path)
    assert job.clock == "step"
    assert job.series["total_loss"].step.tolist() == [19.0 + 20 * i for i in range(30)]


def test_a_cumulative_time_that_restarts_once_is_still_the_clock(tmp_path: Path) -> None:
    """The control: a run's own cumulative ``time`` that starts again at a resume."""
    path = tmp_path / "log.jsonl"
    times = [10.0 * i for i in range(1, 21)] + [5.0 * i for i in range(1, 21)]
    path.write_text("".join(json.dumps({"step": i + 1, "loss": 1.0 / (i + 1), "time": t}) + "\n"
                            for i, t in enumerate(times)))
    job = _load(path)
    assert job.clock == "elapsed"
    t = job.series["loss"].time
    assert t[19] - t[0] == 190.0 and t[-1] - t[20] == 95.0


def test_hugging_face_console_dicts(tmp_path: Path) -> None:
    """The dict the Trainer prints at each logging step, between tqdm redraws (joined by
    carriage returns) and library warnings, as ``nohup python train.py > training.log``
    keeps it."""
    bars = "".join(f"\r  {i // 2}%|          | {i}/200 [00:{i:02d}<10:00, 21.00s/it]"
                   for i in range(1, 11))
    lines = ["2025-06-01 10:00:00.000000: I tensorflow/core/util/port.cc:153] oneDNN on."]
    for k in range(1, 11):
        lines.append(bars)
        lines.append(f"{{'loss': {2.1 - 0.05 * k:.4f}, 'grad_norm': 0.5, 'learning_rate': "
                     f"{2e-5 * k}, 'mean_token_accuracy': 0.57, 'epoch': {0.01 * k:.2f}}}")
    lines.append("{'eval_loss': 1.9, 'eval_runtime': 12.3, 'epoch': 0.1}")
    path = tmp_path / "training.log"
    path.write_text("\n".join(lines) + "\n")
    job = _load(path)
    assert job.series["loss"].value.tolist() == pytest.approx([2.1 - 0.05 * k
                                                               for k in range(1, 11)])
    assert job.series["lr"].value[-1] == pytest.approx(2e-4)
    assert job.series["val_loss"].value.tolist() == [1.9]


def test_bracketed_tags_and_megatron_iterations(tmp_path: Path) -> None:
    nano = tmp_path / "train.log"
    nano.write_text("[train] tokens/iter = 393,216 | vocab = 16384\n"
                    "[eval] iter 0: train 9.8508 val 9.8491 lr 7.50e-07\n"
                    + "".join(f"[train] iter {10 * i}: loss {8.7 - 0.1 * i:.4f} 11136 ms/iter\n"
                              for i in range(1, 21)))
    job = _load(nano)
    assert job.series["loss"].step.tolist() == [10.0 * i for i in range(1, 21)]
    mega = tmp_path / "megatron.log"
    mega.write_text("".join(
        f" iteration {i:8d}/{500:8d} | consumed samples: {16 * i:12d} | elapsed time per "
        f"iteration (ms): 15165.9 | learning rate: 2.000E-07 | global batch size:    16 | "
        f"lm loss: {12.6 - 0.01 * i:.6E} | loss scale: 1.0 | grad norm: 20.203 |\n"
        for i in range(1, 31)))
    job = _load(mega)
    assert job.planned_steps == 500
    loss = job.series["loss"]
    assert loss.step.tolist() == [float(i) for i in range(1, 31)]
    assert loss.value[0] == pytest.approx(12.59)


def test_mmengine_text_logs(tmp_path: Path) -> None:
    """MMEngine's logger: a slashed date, ``Epoch(train) [E][i/N]`` (the iteration restarts
    each epoch, so only the epoch is read) or ``Iter(train) [i/N]``."""
    epochs = tmp_path / "20230605_200941.log"
    epochs.write_text("".join(
        f"2023/06/05 20:{10 + k // 6:02d}:{(k % 6) * 9:02d} - mmengine - INFO - "
        f"Epoch(train)   [{k // 6 + 1}][{k % 6 + 1}/6]  lr: {4e-8 + 2e-4 * k:.6e}  eta: 4:59:11"
        f"  time: 9.978710  data_time: 9.013012  loss: {0.42 - 0.002 * k:.6f}  "
        f"loss_kpt: {0.42 - 0.002 * k:.6f}  acc_pose: 0.007440\n" for k in range(30)))
    job = _load(epochs)
    assert job.clock == "wall"
    loss = job.series["loss"]
    assert len(loss) == 30 and loss.value[-1] == pytest.approx(0.362)
    assert np.diff(loss.time)[:5].tolist() == [9.0] * 5
    assert job.series["epoch"].value.tolist() == [k // 6 + 1.0 for k in range(30)]
    iters = tmp_path / "seg.log"
    iters.write_text("".join(
        f"2024/01/02 10:00:{k:02d} - mmengine - INFO - Iter(train) [{50 * (k + 1):5d}/20000]"
        f"  lr: 1.0000e-02  eta: 1 day, 2:03:04  time: 0.4  data_time: 0.01  memory: 3000  "
        f"loss: {1.5 - 0.01 * k:.4f}  decode.loss_ce: 1.2\n" for k in range(20)))
    job = _load(iters)
    assert job.planned_steps == 20000
    assert job.series["loss"].step.tolist() == [50.0 * (k + 1) for k in range(20)]


def test_olmo_trainer_log(tmp_path: Path) -> None:
    """OLMo's trainer prints a header line per step and a line per metric under it; the
    loss, ``train/CrossEntropyLoss``, was not read (a run with steps and no loss)."""
    lines = []
    for step in range(1, 31):
        lines += [f"2025-12-12 11:{step // 15:02d}:{(step * 4) % 60:02d}.009\thost:0\t"
                  f"olmo.train:979\tINFO\t[step={step}/15000,epoch=0]",
                  "    optim/total_grad_norm=0.2370",
                  f"    train/CrossEntropyLoss={3.0 - step / 100:.3f}",
                  f"    train/Perplexity={20.04 - step / 10:.2f}",
                  "    throughput/total_tokens=2,097,152"]
    path = tmp_path / "training.log"
    path.write_text("\n".join(lines) + "\n")
    job = _load(path)
    assert job.planned_steps == 15000 and job.clock == "wall"
    loss = job.series["loss"]
    assert loss.step.tolist() == list(range(1, 31))
    assert loss.value[0] == pytest.approx(2.99) and loss.value[-1] == pytest.approx(2.70)


def test_stable_baselines3_monitor_csv(tmp_path: Path) -> None:
    """stable-baselines3's ``Monitor`` writes ``#{"t_start": ...}`` above ``r,l,t``: the
    comment line was taken for the header ("row has 3 cells but the header has 2
    columns", a blind held-out LunarLander run). Each episode is read at the environment
    steps taken by its end, on the wall clock ``t_start + t``; ``info_keywords`` columns
    after ``t`` are read as they are."""
    t0 = 1758042302.9
    rows = [(-139.2 + 10 * i, 100 + i, 0.5 * (i + 1), i % 2) for i in range(8)]
    path = tmp_path / "monitor.csv"
    meta = json.dumps({"t_start": t0, "env_id": "LunarLander-v2"})
    path.write_text(f"#{meta}\nr,l,t,is_success\n"
                    + "".join(f"{r:.6f},{n},{t:.6f},{s}\n" for r, n, t, s in rows))
    job = _load(path)
    reward = job.series["episode_reward"]
    assert reward.value.tolist() == pytest.approx([r for r, _, _, _ in rows])
    assert reward.step.tolist() == np.cumsum([n for _, n, _, _ in rows]).tolist()
    assert job.clock == "wall" and reward.time[0] == pytest.approx(t0 + 0.5)
    assert job.series["episode_length"].value[-1] == 107
    assert job.series["is_success"].value.tolist() == [0, 1] * 4
    # as the Monitor writes a flag: True and False (a blind held-out run's ``success``
    # column refused the whole file: "cannot read 'False' as a number")
    path.write_text(f"#{meta}\nr,l,t,is_success\n"
                    + "".join(f"{r:.6f},{n},{t:.6f},{bool(s)}\n" for r, n, t, s in rows))
    assert _load(path).series["is_success"].value.tolist() == [0, 1] * 4


def test_a_csv_with_comment_lines_names_the_files_own_line(tmp_path: Path) -> None:
    """``#`` lines above a CSV's header are skipped; an error still names the line of the
    file it is on."""
    path = tmp_path / "log.csv"
    path.write_text("# exported by a notebook\n# seed 3\nepoch,loss\n0,1.5\n1,x\n")
    with pytest.raises(FormatError) as err:
        load_run(path)
    assert f"{path}:5" in str(err.value) and "'x'" in str(err.value)
    path.write_text("# exported by a notebook\n# seed 3\nepoch,loss,loss\n0,1.5,1.5\n")
    with pytest.raises(FormatError) as err:
        load_run(path)
    assert f"{path}:3" in str(err.value) and "appears twice" in str(err.value)


def test_stable_baselines3_progress_csv(tmp_path: Path) -> None:
    """stable-baselines3's ``progress.csv``: ``time/total_timesteps`` is the step and
    ``time/time_elapsed`` the clock (the run was on its row count, with no clock)."""
    path = tmp_path / "progress.csv"
    path.write_text("rollout/ep_rew_mean,time/fps,time/time_elapsed,time/total_timesteps,"
                    "train/loss\n" + "".join(f"{-80 + 5 * i},300,{7 * (i + 1)},{2048 * (i + 1)},"
                                             f"{40 - i}\n" for i in range(10)))
    job = _load(path)
    reward = job.series["rollout/ep_rew_mean"]
    assert reward.step.tolist() == [2048.0 * (i + 1) for i in range(10)]
    assert job.clock == "elapsed" and np.diff(reward.time).tolist() == [7.0] * 9


def test_a_column_of_text_is_a_label_and_a_measure_of_text_an_error(tmp_path: Path) -> None:
    """A sweep's CSV names its setting in a column of text (``param_type`` = ``mup`` on
    every row): a label, skipped as JSON lines skip theirs; the file was refused whole
    ("cannot read 'mup' as a number"). A loss, accuracy or reward holding text is a
    damaged value and still an error naming the line, and so is a label column that later
    holds a number (no value is dropped unsaid)."""
    path = tmp_path / "sweep.csv"
    path.write_text("step,param_type,loss\n0,mup,2.5\n10,mup,2.1\n20,mup,1.9\n")
    job = _load(path)
    assert job.series["loss"].value.tolist() == [2.5, 2.1, 1.9]
    assert "param_type" not in job.series
    path.write_text("step,param_type,loss\n0,mup,2.5\n10,0.5,2.1\n")
    with pytest.raises(FormatError, match=r"sweep\.csv:3.*'param_type'.*text at line 2"):
        load_run(path)
    path.write_text("step,val_accuracy,loss\n0,n/a,2.5\n10,0.5,2.1\n")
    with pytest.raises(FormatError, match=r"sweep\.csv:2.*'val_accuracy'.*'n/a'"):
        load_run(path)
