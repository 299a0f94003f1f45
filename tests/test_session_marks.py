"""A log written by two processes of one run, the second going on at the next step after
hours: the silence between them was the job down, not a hang, where the log says so (the
first process's opening written again, or a line saying training finished). Where it does
not, a silence is a stall as before. Logs are built in the test and read by the real text
reader (``adapters/local``)."""

from __future__ import annotations

import calendar
import time
from collections.abc import Sequence
from pathlib import Path

from trainguard.adapters.local import load_run
from trainguard.checker import Policy
from trainguard.checker.model import Finding, Severity
from trainguard.replay import replay

T0 = 1_700_000_000.0
BANNER = ["trainer INFO: Using 2 GPUs",
          "trainer INFO: Namespace(config_file='configs/r50.yaml', seed=7)",
          "trainer INFO: Collecting env info (might take some time)",
          "trainer INFO: PyTorch version: 2.1.0"]


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + ",000"


def _time(line: str) -> float:
    """The time a line built by ``_stamp`` begins with."""
    return float(calendar.timegm(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")))


def _log(tmp_path: Path, between: Sequence[str | float], first: list[str] | None = None,
         per_epoch: list[str] | None = None, silence_s: float = 4 * 3600.0,
         line_s: float = 0.0) -> Path:
    """Steps 20..2000 every 20 steps, a record a minute; after step 1000 ``silence_s``
    of nothing, then ``between`` (a line every ``line_s``) and the steps going on at
    1020 (a number in ``between`` is that many seconds more of nothing). ``per_epoch``
    lines come before every 100th step, as an epoch's header would."""
    lines = [f"{_stamp(T0)} {x}" for x in (BANNER if first is None else first)]
    t = T0 + 60.0
    for step in range(20, 2001, 20):
        if step == 1020:
            t += silence_s
            for x in between:
                if isinstance(x, float):
                    t += x
                    continue
                lines.append(f"{_stamp(t)} {x}")
                t += line_s
            t += 60.0
        if per_epoch and step % 100 == 20:
            lines += [f"{_stamp(t - 1)} {x}" for x in per_epoch]
        lines.append(f"{_stamp(t)} trainer INFO: iter: {step}  loss: {2.0 / step ** 0.3:.4f}"
                     f"  lr: 0.010000")
        t += 60.0
    path = tmp_path / "log.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _stall(path: Path) -> Severity | None:
    result = replay(load_run(path), Policy())
    found = [h.worst for h in result.histories if h.rule == "stall"]
    return found[0] if found else None


def test_a_silence_with_nothing_after_it_but_the_next_step_is_a_stall(tmp_path: Path) -> None:
    """The ground every mark stands on: without one, the records cannot tell a process
    resumed by hand from a hang that ended, and the hang is stopped."""
    assert _stall(_log(tmp_path, between=[])) is Severity.CRITICAL


def test_the_opening_written_again_ends_the_silence_as_down(tmp_path: Path) -> None:
    job = load_run(_log(tmp_path, between=BANNER))
    assert len(job.launches) == 1
    assert _stall(tmp_path / "log.txt") is None


def test_a_line_saying_training_finished_ends_the_silence_as_down(tmp_path: Path) -> None:
    path = _log(tmp_path, between=[])
    text = path.read_text().replace("iter: 1020 ", "iter: 1020 ", 1)
    # the first process says it finished after its last step
    lines = text.splitlines()
    at = next(i for i, x in enumerate(lines) if "iter: 1000 " in x)
    lines.insert(at + 1, lines[at][:23] + " trainer INFO: Training complete in 16m 40s")
    path.write_text("\n".join(lines) + "\n")
    assert load_run(path).finishes
    assert _stall(path) is None


def test_a_banner_line_or_two_again_is_not_a_new_process(tmp_path: Path) -> None:
    """Two of the opening's lines (its first among them) are not enough: a script may
    print a line or two of its opening again (a reload of its data)."""
    assert _stall(_log(tmp_path, between=BANNER[:2])) is Severity.CRITICAL


def test_an_epochs_header_in_the_opening_is_not_a_new_process(tmp_path: Path) -> None:
    """The first epoch's header is in the opening (before the first record) and comes
    again with each epoch, three lines of it, one after the silence: no mark, since the
    opening's first line (the process's banner) is not among them."""
    header = ["trainer INFO: Epoch 1 starts", "trainer INFO: train loader: 100 batches",
              "trainer INFO: lr schedule: cosine"]
    path = _log(tmp_path, between=header, first=BANNER[:1] + header, per_epoch=header)
    assert load_run(path).launches == []
    assert _stall(path) is Severity.CRITICAL


def test_a_restart_loop_in_the_silence_is_still_a_stall(tmp_path: Path) -> None:
    """Three processes began after the silence and two died before their first record (a
    loop of crashes, over two hours each): the job was down until the first began, and
    made no progress from there, whoever ran it."""
    loop = [*BANNER, "Traceback (most recent call last):", "RuntimeError: CUDA error"] * 2
    path = _log(tmp_path, between=[*loop, *BANNER], line_s=1500.0)
    assert len(load_run(path).launches) == 3
    assert _stall(path) is Severity.CRITICAL


def test_a_launch_aborted_by_hand_then_one_that_runs(tmp_path: Path) -> None:
    """Four hours down, a process begun and stopped after a few minutes, another begun at
    once that goes on at the next step a few minutes later: no stall (as maskrcnn-
    benchmark's FCOS log shows)."""
    path = _log(tmp_path, between=[*BANNER, *BANNER], line_s=100.0)
    assert len(load_run(path).launches) == 2
    assert _stall(path) is None


def test_launches_stopped_by_hand_hours_before_the_one_that_ran(tmp_path: Path) -> None:
    """Two processes begun and stopped within minutes, then nothing for three hours, then
    the one that ran (as an SSD log shows): the processes before the quiet had ended, and
    the last one is judged from its own launch."""
    path = _log(tmp_path, between=[*BANNER, *BANNER, 3 * 3600.0, *BANNER], line_s=30.0)
    assert len(load_run(path).launches) == 3
    assert _stall(path) is None


def test_a_live_check_gives_a_new_process_its_start_up_time(tmp_path: Path) -> None:
    """Checked while the relaunched process loads (ten minutes after its banner, no
    record yet): its silence counts from its launch, not from the last record hours ago.
    Hours later with still no record, it is a stall again."""
    from trainguard.checker import evaluate

    path = _log(tmp_path, between=BANNER)
    job = load_run(path)
    (launch,) = job.launches
    loading = [f for f in evaluate([job.until(launch + 600.0)], Policy(), launch + 600.0)
               if f.rule == "stall"]
    assert loading == []
    late = launch + 3 * 3600.0
    (f,) = [f for f in evaluate([job.until(launch + 30.0)], Policy(), late)
            if f.rule == "stall"]
    assert f.severity is Severity.CRITICAL and "since its restart" in f.message


def test_a_relaunch_that_has_not_logged_when_the_log_ends(tmp_path: Path) -> None:
    """The log ends with a new process's banner, two days after the last record (as a
    maskrcnn-benchmark log resumed from its checkpoint shows): the earlier process had
    ended; the silence was the job down, not a 42-hour hang."""
    path = _log(tmp_path, between=[], silence_s=0.0)
    lines = path.read_text().splitlines()
    later = _stamp(_time(lines[-1]) + 42 * 3600)
    path.write_text("\n".join([*lines, *(f"{later} {x}" for x in BANNER)]) + "\n")
    assert _stall(path) is None
    # the same silence with nothing written after it: a stall
    path.write_text("\n".join([*lines, f"{later} trainer INFO: still here"]) + "\n")
    assert _stall(path) is Severity.CRITICAL


def test_a_banner_without_a_stamp_is_dated_by_the_next_one(tmp_path: Path) -> None:
    """Tacotron's trainer prints its banner unstamped after the crash before it: the time
    carried to it is the crash's, hours before the process began. The launch is dated by
    the first stamp after it, so the new process is not judged from the crash."""
    unstamped = ["-" * 40, "Starting new training run", "-" * 40]
    lines = [*unstamped, f"{_stamp(T0)} Checkpoint path: ./logs/model.ckpt",
             f"{_stamp(T0)} Loading training data from: ./train.txt"]
    t = T0 + 60.0
    for step in range(1, 301):
        if step == 151:
            lines.append(f"{_stamp(t)} Exiting due to exception: Found Inf or NaN global norm")
            lines += unstamped
            t += 3 * 3600.0
            lines += [f"{_stamp(t)} Checkpoint path: ./logs/model.ckpt",
                      f"{_stamp(t)} Loading training data from: ./train.txt"]
            t += 20 * 60.0  # loading for 20 minutes: within a start's allowance
        lines.append(f"{_stamp(t)} Step {step}   [0.780 sec/step, loss={2.0 / step:.5f}]")
        t += 30.0
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    job = load_run(path)
    assert [round(x - T0) for x in job.launches] == [60 + 150 * 30 + 3 * 3600]
    assert _stall(path) is None


def test_a_fresh_launch_after_a_resume_that_got_nowhere(tmp_path: Path) -> None:
    """A process resumed from its checkpoint, wrote its last step again and died (the
    start of a restart loop); a day later, after nothing in the log, the user began the
    run again: a fresh start, not the loop going on."""
    path = _log(tmp_path, between=[])
    lines = path.read_text().splitlines()
    at = next(i for i, x in enumerate(lines) if "iter: 1000 " in x)
    t = T0 + 60.0 * 51 + 3600.0
    again = [f"{_stamp(t)} {x}" for x in BANNER]
    again.append(f"{_stamp(t + 60)} trainer INFO: iter: 1000  loss: 0.2500  lr: 0.010000")
    again.append(f"{_stamp(t + 70)} Traceback (most recent call last):")
    t += 24 * 3600.0
    again += [f"{_stamp(t)} {x}" for x in BANNER]
    rest = [f"{_stamp(t + 60 * (k + 1))} trainer INFO: iter: {1000 + 20 * (k + 1)}  loss: "
            f"0.2{k:03d}  lr: 0.010000" for k in range(50)]
    path.write_text("\n".join([*lines[:at + 1], *again, *rest]) + "\n")
    assert _stall(path) is None


def test_a_line_saying_training_finished_is_warned_not_stopped(tmp_path: Path) -> None:
    """Live: the loop said it finished and the process writes nothing more: a final
    evaluation (a scene-graph run's test set took 1 h 48 min after "Total training
    time"), a save, or a hang at exit. A warning that says so, never a stop."""
    from trainguard.checker import evaluate

    path = _log(tmp_path, between=[], silence_s=0.0)
    lines = path.read_text().splitlines()
    lines.append(lines[-1][:23] + " trainer INFO: Training complete in 1h 40m")
    path.write_text("\n".join(lines) + "\n")
    job = load_run(path)
    (end,) = job.finishes

    def stall_at(minutes: float) -> list[Finding]:
        now = end + 60.0 * minutes
        return [f for f in evaluate([job], Policy(), now) if f.rule == "stall"]

    assert stall_at(2) == []
    for minutes in (40, 70, 300):
        (f,) = stall_at(minutes)
        assert f.severity is Severity.WARNING
        assert "said training finished" in f.message


def test_a_later_stall_is_judged_on_the_runs_cadence_not_the_down_time(
        tmp_path: Path) -> None:
    """After a relaunch four hours on, the run goes on and then stops for 40 minutes
    mid-run: a stall. The four hours down are not learnt as a pause the job takes, or a
    threshold of hours would hide it (a guard on the fresh learning of a short run;
    ``test_the_cadence_read_record_by_record_sees_a_launch_as_a_resume`` holds the
    record-by-record path)."""
    path = _log(tmp_path, between=BANNER)
    lines = path.read_text().splitlines()
    at = next(i for i, x in enumerate(lines) if "iter: 1800 " in x)
    head, tail = lines[:at], lines[at:]
    shifted = [_stamp(_time(x) + 40 * 60.0) + x[23:] for x in tail]
    path.write_text("\n".join([*head, *shifted]) + "\n")
    assert _stall(path) is Severity.CRITICAL


def test_the_cadence_read_record_by_record_sees_a_launch_as_a_resume() -> None:
    """Beyond 1,024 records a replay extends the stall's cadence record by record
    (``Cadence.read``) instead of learning it afresh: it must call the silence across a
    launch down as ``check``'s fresh learning does (``cost.resumes``), or the four hours
    would be learnt as a gap of the job and a later stall hidden behind them."""
    import numpy as np

    from trainguard.checker.model import Job, Series
    from trainguard.checker.rules.stall import Cadence

    steps = np.arange(1.0, 3001.0)
    times = T0 + steps * 10.0
    times[2500:] += 4 * 3600.0  # down for four hours before record 2501
    launch = float(times[2500]) - 60.0
    job = Job(id="j", launches=[launch],
              series={"step": Series("step", times, steps, steps)})
    src = job.series["step"]
    whole = Cadence.learn(job, src, len(src), ("m",), 3)
    extended = Cadence.learn(job, src, 2048, ("m",), 3)
    extended.read(job, src, 3)
    assert whole.longest == extended.longest < 60.0
    assert (whole.count, whole.updates, whole.loop) == (
        extended.count, extended.updates, extended.loop)


def test_a_configuration_dict_first_is_the_opening_not_a_record(tmp_path: Path) -> None:
    """so-vits-svc's log (a blind set's run, read with no definitions): each launch
    prints its configuration as a dict of sections, ``{'train': {'log_interval': 200,
    'learning_rate': 0.0001, ...}, ...}``, then loads its checkpoints. Read as a record
    (its ``learning_rate``), the first line was the log's first record, so the lines a
    relaunch writes before training were no opening of a new process, and the night
    between two launches was a stall stopped after 5.8 hours. A dict of sections is a
    configuration, kept as a log line; a trainer's flat metrics dict is still read."""
    opening = ["32k INFO {'train': {'log_interval': 200, 'eval_interval': 1000, "
               "'learning_rate': 0.0001, 'epochs': 10000}, 'data': {'sampling_rate': 32000}}",
               "32k INFO Loaded checkpoint './logs/32k/G_0.pth' (iteration 1)",
               "32k INFO Loaded checkpoint './logs/32k/D_0.pth' (iteration 1)"]
    path = _log(tmp_path, between=opening, first=opening, silence_s=19 * 3600.0)
    job = load_run(path)
    assert len(job.launches) == 1 and _stall(path) is None
    assert job.series["lr"].value[0] == 0.01  # the configuration's 0.0001 is no record
    flat = tmp_path / "flat.txt"
    flat.write_text("{'loss': 2.1, 'learning_rate': 3.4e-05, 'epoch': 0.01}\n"
                    "{'loss': 1.9, 'learning_rate': 3.3e-05, 'epoch': 0.02}\n")
    assert list(load_run(flat).series["loss"].value) == [2.1, 1.9]


def _slow_ends(tmp_path: Path, banner: bool) -> Path:
    """A record of 20 steps a minute; the process's last 12 minutes a record every 3 (a
    final evaluation between its records), then, after 4 hours, the run going on: its
    first 12 minutes a record every 3 (a new process's warm-up) and a minute apart after.
    With ``banner``, the log says a new process began (its opening written again)."""
    lines = [f"{_stamp(T0)} {x}" for x in BANNER]
    t, step = T0 + 60.0, 20
    for gap in [60.0] * 60 + [180.0] * 4 + ["down"] + [180.0] * 4 + [60.0] * 40:
        if gap == "down":
            t += 4 * 3600.0
            if banner:
                lines += [f"{_stamp(t + k)} {x}" for k, x in enumerate(BANNER)]
            continue
        assert isinstance(gap, float)
        t += gap
        lines.append(f"{_stamp(t)} trainer INFO: iter: {step}  loss: {2.0 / step ** 0.3:.4f}")
        step += 20
    path = tmp_path / "slow.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_down_time_between_two_processes_is_no_slowdown(tmp_path: Path) -> None:
    """The same log's night between two launches read as one epoch in 19.5 hours: the
    slow end of one process (a final evaluation) and the warm-up of the next made one
    slow stretch across the four hours down, warned as a slowdown of 1,169 minutes. A
    launch ends the stretch of the process before it, and the new process has a warm-up
    of its own. Without the log's word that a new process began, the same records are
    still a slowdown (a silence the log does not explain is judged as before)."""
    def slowdowns(path: Path) -> list[str]:
        result = replay(load_run(path), Policy())
        return [h.finding.message for h in result.histories if h.rule == "slowdown"]

    assert slowdowns(_slow_ends(tmp_path, banner=True)) == []
    (said,) = slowdowns(_slow_ends(tmp_path, banner=False))
    assert "of the job's own baseline" in said


def test_a_yaml_configuration_at_a_relaunch_is_no_record(tmp_path: Path) -> None:
    """PaddleSeg's log (a blind set's ENCNet run, read with no definitions): a false start
    of 450 iterations, then a relaunch on more GPUs 75 s on, whose configuration is
    printed as YAML, ``lr_scheduler:`` and under it ``  learning_rate: 0.01``. Read as a
    record at the relaunch, that rate wrote iteration 450 again there and was taken for
    the resume, so the new process's iterations up to 450 were no progress: a stall
    warned 5 minutes after the relaunch. The settings of a YAML document that nests are
    no records; a flat block (``Validation:`` and its indented ``loss: 0.41``) still is."""
    from trainguard.checker import evaluate

    config = ["---------------Config Information---------------", "batch_size: 2",
              "loss:", "  coef:", "  - 1", "lr_scheduler:", "  end_lr: 0",
              "  learning_rate: 0.01", "  power: 0.9", "model:", "  type: ENCNet"]
    lines, t = [], T0

    def process(first: int, last: int) -> None:
        nonlocal t
        lines.append(f"{_stamp(t)} [INFO] ------------Environment Information-----------")
        lines.extend(config)
        t += 30.0
        for it in range(first, last + 1, 10):
            lines.append(f"{_stamp(t)} [INFO] [TRAIN] epoch: 1, iter: {it}/80000, "
                         f"loss: {3.0 / it ** 0.2:.4f}, lr: 0.009990, batch_cost: 1.0990")
            t += 11.0

    process(10, 450)
    t += 75.0
    relaunch = t
    process(10, 1500)
    path = tmp_path / "workerlog.0"
    path.write_text("\n".join(lines) + "\n")
    job = load_run(path)
    assert "lr" in job.series and job.series["lr"].value.min() < 0.01  # the steps' own
    for minutes in (5, 8, 12):
        now = relaunch + 60.0 * minutes
        assert [f for f in evaluate([job.until(now)], Policy(), now)
                if f.rule == "stall"] == [], minutes
    flat = tmp_path / "flat.txt"
    flat.write_text("Epoch 1/3\nValidation:\n    loss: 0.41\n    accuracy: 0.8\n"
                    "Epoch 2/3\nValidation:\n    loss: 0.38\n    accuracy: 0.82\n")
    assert list(load_run(flat).series["loss"].value) == [0.41, 0.38]


def test_the_latest_mark_between_two_times() -> None:
    """``cost.last_mark``, shared by ``stall`` (``marked``, both ends counted) and
    ``slowdown`` (after its last record only: a mark at that record's own time was read
    with it)."""
    from trainguard.checker import cost
    from trainguard.checker.model import Job

    job = Job(id="j", launches=[10.0, 50.0], finishes=[40.0])
    assert cost.last_mark(job, 0.0, 45.0) == 40.0
    assert cost.last_mark(job, 10.0, 30.0) is None  # (10, 30]
    assert cost.last_mark(job, 10.0, 30.0, after=False) == 10.0  # [10, 30]
    assert cost.last_mark(job, 41.0, 49.0) is None and not cost.marked(job, 41.0, 49.0)
    assert cost.marked(job, 50.0, 60.0)
