"""A run resumed from a checkpoint: the step goes back after a silence far beyond the
run's cadence. The silence was the job being down; the resumed process is progress. A
long silence with no resume after it is still a stall. Curves are built in the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainguard.checker import cost
from trainguard.checker.evaluate import evaluate
from trainguard.checker.model import Finding, Job, JobState, Series, Severity
from trainguard.checker.policy import Policy
from trainguard.replay import replay

T0 = 1_700_000_000.0
EPOCH_S = 480.0  # eight minutes an epoch
DOWN_S = 10 * 3600.0  # the job is down for ten hours


def resumed_job(resume: bool = True) -> Job:
    """Epochs 1..25 every 8 min; then ten hours of silence; then, resumed from the epoch-20
    checkpoint, epochs 21..30 (or, without ``resume``, epochs 26..30 as if the same
    process went on)."""
    first = np.arange(1, 26, dtype=float)
    second = np.arange(21, 31, dtype=float) if resume else np.arange(26, 31, dtype=float)
    t1 = T0 + first * EPOCH_S
    t2 = t1[-1] + DOWN_S + np.arange(1, len(second) + 1) * EPOCH_S
    steps, times = np.concatenate([first, second]), np.concatenate([t1, t2])
    loss = 2.0 / np.sqrt(steps)
    return Job(id="resumed", provider="local", state=JobState.RUNNING, start_time=T0,
               series={"step": Series("step", times, steps, steps),
                       "loss": Series("loss", times, steps, loss)})


def test_a_resume_is_seen_and_a_wrapping_step_counter_is_not() -> None:
    job = resumed_job()
    prog = cost.progress(job)
    assert prog is not None
    assert cost.resumes(prog).tolist() == [25]
    # a per-epoch batch counter wraps every 100 records at the usual cadence: no resume
    steps = np.tile(np.arange(100.0), 5)
    times = np.asarray(T0 + np.arange(len(steps)) * 10.0, dtype=np.float64)
    assert cost.resumes(Series("step", times, steps, steps)).tolist() == []


def test_the_resumed_process_counts_as_progress_at_once() -> None:
    job = resumed_job()
    resumed_at = float(job.series["step"].time[25])
    now = resumed_at + 60.0  # one minute after the resumed process logged epoch 21 again
    found = [f for f in evaluate([job.until(now)], Policy(), now) if f.rule == "stall"]
    assert found == []


def test_the_down_time_is_not_learnt_as_a_pause_of_the_job() -> None:
    job = resumed_job()
    last = float(job.series["step"].time[-1])
    now = last + 3 * 3600.0  # three silent hours after the resumed run's last epoch
    (f,) = [f for f in evaluate([job.until(now)], Policy(), now) if f.rule == "stall"]
    assert f.severity is Severity.CRITICAL
    assert f.evidence["threshold_s"] < DOWN_S / 4  # learnt from the 8-minute cadence


def test_replay_calls_the_time_before_a_resume_down_not_a_stall() -> None:
    result = replay(resumed_job(), Policy())
    assert not [h for h in result.histories if h.rule == "stall"]


def test_a_long_silence_with_no_resume_after_it_is_still_a_stall() -> None:
    result = replay(resumed_job(resume=False), Policy())
    (h,) = [h for h in result.histories if h.rule == "stall"]
    assert h.worst is Severity.CRITICAL


def test_a_log_file_keeps_the_resume_and_drops_a_late_metric(tmp_path: Path) -> None:
    """Read by the real JSON-lines reader, as ``check`` and ``replay`` read it."""
    import json

    from trainguard.adapters.local import load_run

    job = resumed_job()
    lines = [{"step": s, "time": t, "loss": v} for t, s, v in
             zip(job.series["loss"].time, job.series["loss"].step, job.series["loss"].value,
                 strict=True)]
    # an evaluation of epoch 24's checkpoint logged a minute after epoch 25: no resume
    lines.insert(25, {"step": 24.0, "time": lines[24]["time"] + 60, "val_loss": 1.0})
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    prog = cost.progress(load_run(path))
    assert prog is not None
    assert prog.step.tolist() == [*range(1, 26), *range(21, 31)]
    assert cost.resumes(prog).tolist() == [25]


def restarted_job(startup_s: float = 60.0, restart: bool = True) -> Job:
    """A SageMaker job, as the adapter maps DescribeTrainingJob: it started at T0, made its
    first progress ``startup_s`` later, then a step a minute for 200 minutes; it was
    interrupted and, five hours later, restarted (a ``Restarting`` transition). The
    restarted process has not logged yet."""
    from trainguard.adapters.sagemaker.mapping import to_job

    first = T0 + startup_s
    restarted = first + 200 * 60.0 + 5 * 3600.0
    doc = {
        "TrainingJobName": "spot-a",
        "TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/spot-a",
        "TrainingJobStatus": "InProgress", "SecondaryStatus": "Training",
        "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 1},
        "CreationTime": T0, "TrainingStartTime": T0,
        "SecondaryStatusTransitions": [
            {"Status": "Starting", "StartTime": T0},
            {"Status": "Training", "StartTime": T0},
            *([{"Status": "Restarting", "StartTime": restarted}] if restart else []),
        ],
    }
    job = to_job(doc, tags={})
    steps = np.arange(1.0, 201.0)
    times = first + (steps - 1) * 60.0
    job.series = {"loss": Series("loss", times, steps, 2.0 / np.sqrt(steps))}
    return job


def _stall(job: Job, now: float) -> list[Finding]:
    return [f for f in evaluate([job.until(now)], Policy(), now) if f.rule == "stall"]


def test_a_restarted_process_is_given_the_start_up_time_of_a_new_one() -> None:
    """A spot interruption or pod restart after hours down: the new process loads its
    checkpoint before it logs. Counted from the last record before the interruption, its
    silence was critical at once and a policy allowing stops would stop it while it
    loads. Counted from the restart, with the allowance of a start, it is not."""
    job = restarted_job()
    (restarted,) = job.restart_times
    for minutes in (1, 10, 29):
        assert _stall(job, restarted + minutes * 60.0) == []
    (warn,) = _stall(job, restarted + 35 * 60.0)
    assert warn.severity is Severity.WARNING
    assert "since its restart" in warn.message and warn.started_at == restarted
    (crit,) = _stall(job, restarted + 65 * 60.0)
    assert crit.severity is Severity.CRITICAL  # a restarted process that hangs is still caught
    # without the restart the same silence is a stall on the job's one-minute cadence
    quiet = restarted_job(restart=False)
    (hung,) = _stall(quiet, restarted + 60.0)
    assert hung.severity is Severity.CRITICAL


def test_a_slow_start_is_allowed_again_after_a_restart() -> None:
    """A job that took 50 minutes from its start to its first step (a large checkpoint,
    compilation) gets one and a half times that after a restart, not the half hour a job
    of unknown start-up gets."""
    job = restarted_job(startup_s=50 * 60.0)
    (restarted,) = job.restart_times
    assert _stall(job, restarted + 70 * 60.0) == []
    (warn,) = _stall(job, restarted + 80 * 60.0)
    assert warn.severity is Severity.WARNING


def test_progress_after_the_restart_is_judged_on_the_learnt_cadence_again() -> None:
    job = restarted_job()
    (restarted,) = job.restart_times
    loss = job.series["loss"]
    later = restarted + 600.0 + np.arange(10) * 60.0  # logging again from 10 min on
    steps = 190.0 + np.arange(10)  # resumed from the step-190 checkpoint
    job.series["loss"] = Series("loss", np.concatenate([loss.time, later]),
                                np.concatenate([loss.step, steps]),
                                np.concatenate([loss.value, 2.0 / np.sqrt(steps)]))
    assert _stall(job, later[-1] + 120.0) == []
    (f,) = _stall(job, later[-1] + 15 * 60.0)  # 15 silent minutes on a one-minute cadence
    assert "since its restart" not in f.message


def _lines_job(tmp_path: Path, lines: list[dict[str, float]]) -> Job:
    """``lines`` written as a JSON-lines log and read back by the real reader."""
    import json

    from trainguard.adapters.local import load_run

    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return load_run(path)


def test_a_resume_that_logs_its_last_step_again_is_a_resume(tmp_path: Path) -> None:
    """Resumed from the checkpoint of the last step it logged (epoch 25), the process
    writes epoch 25's record again ten hours later. Read as no progress, the resumed run
    was critically stalled from its first record until its next (a watchdog allowed to
    stop would have stopped it) and ``replay`` called the down time a stall."""
    steps = [*range(1, 26), *range(25, 31)]
    times = [T0 + e * EPOCH_S for e in range(1, 26)]
    times += [times[-1] + DOWN_S + i * EPOCH_S for i in range(1, 7)]
    job = _lines_job(tmp_path, [{"step": s, "time": t, "loss": 2.0 / s ** 0.5, "lr": 1e-3}
                                for s, t in zip(steps, times, strict=True)])
    prog = cost.progress(job)
    assert prog is not None and cost.resumes(prog, job).tolist() == [25]
    resumed_at = times[25]
    assert _stall(job, resumed_at + 60.0) == []
    assert not [h for h in replay(job, Policy()).histories if h.rule == "stall"]
    (f,) = _stall(job, times[-1] + 3 * 3600.0)  # a hang after the resume is still one
    assert f.severity is Severity.CRITICAL


def test_an_evaluation_logged_at_its_training_step_is_no_resume(tmp_path: Path) -> None:
    """A step a minute; every 100 steps a 40-minute evaluation, logged at the training
    step it evaluated with the epoch counter in both records. The evaluation's record
    repeats the step after a silence, as a resume's would, but the training record is not
    written again: it is a pause, learnt as one, and a later evaluation as long is no
    stall. Read as a resume, the pause would not be learnt and every evaluation would
    be a stall."""
    lines: list[dict[str, float]] = []
    t = T0
    for s in range(1, 351):
        t += 60.0
        lines.append({"step": s, "time": t, "loss": 2.0 / s ** 0.5, "epoch": s / 100})
        if s % 100 == 0:
            t += 40 * 60.0
            lines.append({"step": s, "time": t, "eval_loss": 2.2 / s ** 0.5, "epoch": s / 100})
    job = _lines_job(tmp_path, lines)
    prog = cost.progress(job)
    assert prog is not None and cost.resumes(prog, job).tolist() == []
    third_eval = next(x["time"] for x in lines if x["step"] == 300 and "eval_loss" in x)
    assert _stall(job, third_eval - 60.0) == []  # 39 minutes into the third evaluation
    # the same records as a cloud adapter hands them: no step series, the epoch counter
    # the longest series (the source of progress), so no witness of a resume
    del job.series["step"]
    source = cost.progress_source(job)
    assert source is not None and source.name == "epoch"
    prog = cost.progress(job)
    assert prog is not None and cost.resumes(prog, job).tolist() == []
    assert _stall(job, third_eval - 60.0) == []


def test_a_tensorboard_resume_that_logs_its_last_step_again(tmp_path: Path) -> None:
    """TensorBoard stamps each scalar with its own wall time, a millisecond apart within
    one step: the resumed process's record is told by its first scalar, which logged the
    same step last before the silence. Written by tensorboardX, read by the real reader."""
    from tensorboardX import SummaryWriter

    from trainguard.adapters.local import load_run

    steps = [*range(1, 26), *range(25, 31)]
    times = [T0 + e * EPOCH_S for e in range(1, 26)]
    times += [times[-1] + DOWN_S + i * EPOCH_S for i in range(1, 7)]
    with SummaryWriter(str(tmp_path / "tb")) as w:
        for s, t in zip(steps, times, strict=True):
            w.add_scalar("train/loss", 2.0 / s ** 0.5, global_step=s, walltime=t)
            w.add_scalar("train/lr", 1e-3, global_step=s, walltime=t + 0.001)
            w.add_scalar("train/grad_norm", 0.5, global_step=s, walltime=t + 0.002)
    job = load_run(tmp_path / "tb")
    prog = cost.progress(job)
    assert prog is not None and cost.resumes(prog, job).tolist() == [25]
    assert _stall(job, times[25] + 60.0) == []
    assert not [h for h in replay(job, Policy()).histories if h.rule == "stall"]


def _down_then(job: Job, repeat: bool) -> Job | None:
    """``job`` down for a long silence (20 x its median record gap, at least 4 hours) after
    60 % of its progress records; with ``repeat``, the process that comes back first writes
    the record at the cut again (every series that logged that step), as a process resumed
    from that step's checkpoint does. None for a run too short to cut."""
    prog = job.series.get("step")
    if prog is None or len(prog) < 20:
        return None
    i = int(len(prog) * 0.6)
    cut, at_step = float(prog.time[i]), float(prog.step[i])
    down = max(20 * float(np.median(np.diff(prog.time))), 4 * 3600.0)
    series = {}
    for name, s in job.series.items():
        t = np.where(s.time > cut, s.time + down, s.time)
        j = int(np.searchsorted(s.time, cut, "right"))  # records up to the cut
        again = repeat and j > 0 and s.step[j - 1] == at_step
        k = [j - 1] if again else []
        series[name] = Series(name, np.r_[t[:j], [cut + down] * len(k), t[j:]],
                              np.r_[s.step[:j], s.step[k], s.step[j:]],
                              np.r_[s.value[:j], s.value[k], s.value[j:]])
    end = job.end_time + down if job.end_time is not None else None
    return Job(**{**job.__dict__, "series": series, "end_time": end})


@pytest.mark.realdata
def test_real_runs_resumed_at_their_last_step_are_not_stalls() -> None:
    """Every healthy and spiky run on a time axis (of ``runs``, and every twentieth of
    ``curves``: modded-nanogpt's step lines carry no metric), taken down for hours after
    60 % of its records: coming back by writing its last record again, it is a resume
    (``replay`` calls the silence down, no stall); coming back at the next step, the
    silence is a stall (critical), as it must be."""
    from tests.corpora import labelled
    from trainguard.bench.harness import load

    judged, wrong = 0, []
    for row in labelled():
        job = load(row)
        if job.clock == "step" or row.label not in ("healthy", "spiky"):
            continue
        for repeat in (True, False):
            built = _down_then(job, repeat)
            if built is None:
                continue
            judged += 1
            stalls = [h for h in replay(built, Policy()).histories
                      if h.rule == "stall" and h.worst is Severity.CRITICAL]
            if bool(stalls) == repeat:
                wrong.append((row.run, repeat))
    assert judged >= 40 and not wrong, (judged, wrong)


def test_a_step_line_alone_written_again_after_a_silence_is_a_resume(tmp_path: Path) -> None:
    """A log whose step lines carry no metric (a validation loss now and then): the
    resumed process's first line is the last step's line again, with nothing else to
    tell it by. Read by the real JSON-lines reader."""
    steps = [*range(1, 26), *range(25, 31)]
    times = [T0 + e * EPOCH_S for e in range(1, 26)]
    times += [times[-1] + DOWN_S + i * EPOCH_S for i in range(1, 7)]
    lines: list[dict[str, float]] = [{"step": s, "time": t}
                                     for s, t in zip(steps, times, strict=True)]
    for x in lines[4::5]:
        x["val_loss"] = 2.0 / x["step"] ** 0.5
    job = _lines_job(tmp_path, lines)
    prog = cost.progress(job)
    assert prog is not None and cost.resumes(prog, job).tolist() == [25]
    assert _stall(job, times[25] + 60.0) == []
    assert not [h for h in replay(job, Policy()).histories if h.rule == "stall"]


def test_heartbeats_through_a_hung_evaluation_are_no_resume(tmp_path: Path) -> None:
    """A step every 5 s, then an evaluation that hangs while a heartbeat thread goes on
    logging every 30 s, at the step it is at. A heartbeat repeats the step after a
    silence six times the run's cadence, as a resume's first record would, but it is no
    record of the run: the hung evaluation is still a stall past the pause cap.
    (``trainguard.emit``'s heartbeats carry no step; a logger of one's own may.)"""
    lines: list[dict[str, float]] = [
        {"step": s, "time": T0 + 5 * s, "loss": 2.0 / s ** 0.5} for s in range(1, 301)]
    beats = [T0 + 1501 + 30 * k for k in range(141)]  # 70 minutes of heartbeats
    lines += [{"step": 300, "time": b, "heartbeat": b - T0 - 1501} for b in beats]
    job = _lines_job(tmp_path, lines)
    assert len(job.series["heartbeat"]) == len(beats)
    prog = cost.progress(job)
    assert prog is not None and cost.resumes(prog, job).tolist() == []
    (f,) = _stall(job, beats[-1] + 5.0)
    assert f.severity is Severity.CRITICAL


def _loop_lines(loops: int, every_s: float, then: int = 0, before: int = 25,
                cadence_s: float = EPOCH_S) -> list[dict[str, float]]:
    """Steps 1..``before`` every ``cadence_s`` (epochs every 8 min); then a restart loop:
    every ``every_s`` a new process resumes from the last step's checkpoint, writes its
    record again and dies, ``loops`` times; then, with ``then``, one that goes on."""
    lines = [{"step": s, "time": T0 + s * cadence_s, "loss": 2.0 / s ** 0.5}
             for s in range(1, before + 1)]
    t = T0 + before * cadence_s
    for _ in range(loops):
        t += every_s
        lines.append({"step": before, "time": t, "loss": 2.0 / before ** 0.5})
    for s in range(before + 1, before + 1 + then):
        t += cadence_s
        lines.append({"step": s, "time": t, "loss": 2.0 / s ** 0.5})
    return lines


def test_a_restart_loop_is_one_stall_from_its_first_resume(tmp_path: Path) -> None:
    """Each process of a restart loop (an OOM at the first batch, say) writes its
    checkpoint's record again and dies. Each record is a resume, and a resume is
    progress, so before this every restart hid the silence before it: the stall
    started again from zero every 45 minutes, and a ``check`` or a ``replay`` made just
    after a restart saw nothing at all. A resume whose process before got no further is
    no progress: the silence runs from the loop's first resume."""
    job = _lines_job(tmp_path, _loop_lines(loops=6, every_s=45 * 60.0))
    resumed = [float(t) for t in job.series["step"].time[25:]]
    (f,) = _stall(job, resumed[2] + 60.0)  # a minute after the third restart
    assert f.severity is Severity.CRITICAL
    assert f.evidence["silence_s"] == pytest.approx(resumed[2] + 60.0 - resumed[0])
    assert f.evidence["resumes_without_progress"] == 3
    assert "resumed 3 times without getting past step 25: a restart loop" in f.message
    (h,) = [h for h in replay(job, Policy()).histories if h.rule == "stall"]
    assert h.worst is Severity.CRITICAL
    # the first resume is a fresh start, as before: no stall a minute after it
    assert _stall(job, resumed[0] + 60.0) == []


@pytest.mark.parametrize("then", [3, 40])  # the first steps after it read one by one, or
def test_a_followed_restart_loop_is_judged_as_one_judged_afresh(   # learnt again
        tmp_path: Path, then: int) -> None:
    """The stall rule reads a followed run's records beyond its learnt prefix one at a
    time (``Cadence.read``; the prefix is relearnt at block boundaries, so the run is
    longer than ``max_points``); with ``max_points`` beyond the run it learns them all
    at once (``Cadence.learn``): both must count the loop, and the gaps they learn, the
    same, at every record of the loop and after, and every five minutes between."""
    from tests.told import Teller
    from trainguard.checker.follow import Followers
    from trainguard.checker.rules.base import Context
    from trainguard.checker.rules.stall import Stall

    job = _lines_job(tmp_path, _loop_lines(loops=4, every_s=50 * 60.0, then=then,
                                           before=1500, cadence_s=10.0))
    times = job.series["step"].time[1490:]
    ticks = np.union1d(times, np.arange(times[0], times[-1] + 3 * 3600.0, 300.0))
    followers, followed, fresh = Followers(), Stall(), Stall({"max_points": 10**6})
    teller, policy, seen = Teller(followers), Policy(), 0
    for t in ticks.tolist():
        cut = teller.cut(job, t)
        a = followers.check(followed, cut, Context(now=t, policy=policy, jobs=[cut]))
        b = fresh.check(cut, Context(now=t, policy=policy, jobs=[cut]))
        assert [(f.severity, f.message, f.evidence) for f in a] == \
            [(f.severity, f.message, f.evidence) for f in b], t
        seen += any("restart loop" in f.message for f in b)
    assert seen > 10
    # the hours of the loop are no gap of the job's own: a hang after it is judged on
    # the learnt 10-second cadence (the 300 s floor), not on hours
    (f,) = b
    assert "restart loop" not in f.message and f.evidence["threshold_s"] == 300.0


def test_after_a_restart_loop_ends_the_down_time_is_not_learnt(tmp_path: Path) -> None:
    """Two restarts that got nowhere, then a process that trains on: progress again, and
    the hours of the loop are not one of the job's own update gaps (which would raise
    every later threshold to hours)."""
    job = _lines_job(tmp_path, _loop_lines(loops=3, every_s=60 * 60.0, then=30))
    last = float(job.series["step"].time[-1])
    assert _stall(job, last + 60.0) == []
    (f,) = _stall(job, last + 3 * 3600.0)  # and then it hangs
    assert f.severity is Severity.CRITICAL
    assert f.evidence["threshold_s"] < 3600.0
    assert "restart loop" not in f.message
