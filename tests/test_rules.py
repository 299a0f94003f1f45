"""Each rule on small constructed runs: what fires, at what severity, and what stays quiet."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from trainguard.checker import (
    AccountBudget,
    Action,
    Budget,
    Cost,
    Job,
    JobState,
    LogLine,
    Policy,
    RuleConfig,
    Series,
    Severity,
    evaluate,
)
from trainguard.checker.registry import RULES, rule_names

T0 = 1_750_000_000.0  # a fixed wall clock: 2025-06-15


def run(loss: np.ndarray, *, dt: float = 10.0, extra: dict[str, np.ndarray] | None = None,
        **job: object) -> Job:
    """A running job logging ``loss`` every ``dt`` seconds, one step per record."""
    n = len(loss)
    t = T0 + np.arange(n, dtype=np.float64) * dt
    step = np.arange(n, dtype=np.float64)
    series = {"loss": Series("loss", t.copy(), step.copy(), loss),
              "step": Series("step", t.copy(), step.copy(), step.copy())}
    for name, values in (extra or {}).items():
        series[name] = Series(name, t[: len(values)].copy(), step[: len(values)].copy(), values)
    kw: dict[str, object] = {"id": "job-1", "start_time": T0, "series": series}
    kw.update(job)
    return Job(**kw)  # type: ignore[arg-type]


def decaying(n: int, seed: int = 0, noise: float = 0.02) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 2.0 + 8.0 * np.exp(-np.arange(n) / (n / 4)) + rng.normal(0, noise, n)


def only(findings: list, rule: str) -> list:  # type: ignore[type-arg]
    return [f for f in findings if f.rule == rule]


def at_end(job: Job, policy: Policy | None = None, after: float = 0.0) -> list:  # type: ignore[type-arg]
    now = job.last_time()
    assert now is not None
    return evaluate([job], policy or Policy(), now + after)


def test_every_rule_is_registered_with_documented_params() -> None:
    assert {"stall", "divergence", "plateau", "utilization", "restarts", "budget",
            "logs", "overfit"} <= set(rule_names())
    for name in rule_names():
        for pname, _default, doc in RULES[name].describe():
            assert doc, f"{name}.{pname} has no documentation"


def test_healthy_run_has_no_findings() -> None:
    assert at_end(run(decaying(500))) == []


# divergence ------------------------------------------------------------------------------

def test_nan_that_persists_is_critical_at_the_first_nonfinite_step() -> None:
    loss = decaying(300)
    loss[200:] = np.nan
    (f,) = only(at_end(run(loss)), "divergence")
    assert f.severity is Severity.CRITICAL
    assert f.step == 200
    assert f.evidence["first_nonfinite_step"] == 200


def test_a_single_trailing_nan_waits_one_interval() -> None:
    loss = decaying(300)
    loss[-1] = np.inf
    (f,) = only(at_end(run(loss)), "divergence")
    assert f.severity is Severity.WARNING
    loss2 = np.append(loss, np.nan)
    (f2,) = only(at_end(run(loss2)), "divergence")
    assert f2.severity is Severity.CRITICAL and f2.step == 299


def test_growth_into_nan_reports_the_blowup_start() -> None:
    loss = decaying(300)
    loss[250:256] = loss[249] * 3.0 ** np.arange(1, 7) * 10
    loss[256:] = np.nan
    (f,) = only(at_end(run(loss)), "divergence")
    assert f.severity is Severity.CRITICAL
    assert f.step <= 256


def test_spike_that_recovers_is_info_not_critical() -> None:
    loss = decaying(400)
    loss[200:202] = 500.0
    fs = only(at_end(run(loss)), "divergence")
    assert [f.severity for f in fs] == [Severity.INFO]
    assert fs[0].evidence["spike_points"] == 2


def test_blowup_that_stays_is_critical() -> None:
    loss = decaying(400)
    loss[300:] = 5e4
    (f,) = only(at_end(run(loss)), "divergence")
    assert f.severity is Severity.CRITICAL and f.step == 300


def test_sign_changing_gan_losses_do_not_diverge() -> None:
    rng = np.random.default_rng(3)
    critic = rng.normal(0, 0.2, 400)
    assert only(at_end(run(critic)), "divergence") == []


# stall -----------------------------------------------------------------------------------

def test_stall_fires_after_the_learnt_threshold_not_before() -> None:
    job = run(decaying(200), dt=10.0)
    # cadence 10 s, so the threshold is the 300 s floor
    assert only(at_end(job, after=290), "stall") == []
    (f,) = only(at_end(job, after=320), "stall")
    assert f.severity is Severity.WARNING
    assert f.evidence["threshold_s"] == pytest.approx(300)
    # twice the threshold, but no stop before Debugger's 30 minutes: a first evaluation
    # or a final checkpoint may last a quarter of an hour
    (f,) = only(at_end(job, after=700), "stall")
    assert f.severity is Severity.WARNING
    (f,) = only(at_end(job, after=1790), "stall")
    assert f.severity is Severity.WARNING
    (f,) = only(at_end(job, after=1810), "stall")
    assert f.severity is Severity.CRITICAL


def test_a_silence_after_the_planned_steps_says_the_job_has_not_exited() -> None:
    """A loop that ran its 1,000 planned steps (logging every 50: step 950 last) and whose
    process never exits (a process-group teardown that hangs, an upload) is told apart
    from one silent half-way; the severity is the same (a final save may take as long as
    a checkpoint)."""
    def logged(upto: int) -> Job:
        job = run(decaying(upto // 50 + 1), dt=10.0, planned_steps=1000)
        for s in job.series.values():
            s.step[:] = np.arange(len(s), dtype=np.float64) * 50
        job.series["step"].value[:] = job.series["step"].step
        return job

    (done,) = only(at_end(logged(950), after=400), "stall")
    (half,) = only(at_end(logged(500), after=400), "stall")
    assert "reached its planned 1000 steps and has not exited" in done.message
    assert done.evidence["ran_its_steps"] is True
    assert "planned" not in half.message and "ran_its_steps" not in half.evidence
    assert done.severity is half.severity is Severity.WARNING


def test_stall_threshold_grows_with_a_slow_cadence_and_recovered_pauses() -> None:
    loss = decaying(200)
    job = run(loss, dt=200.0)
    # a 200 s cadence: the threshold is 2.5 x 200 s = 500 s, above the 300 s floor
    assert only(at_end(job, after=450), "stall") == []
    (f,) = only(at_end(job, after=520), "stall")
    assert f.evidence["threshold_s"] == pytest.approx(500)
    job2 = run(loss, dt=10.0)
    # an evaluation pause of 400 s that the job came back from
    for s in job2.series.values():
        s.time[100:] += 400
    assert only(at_end(job2, after=500), "stall") == []  # 1.5 x 410 s gap = 615 s threshold
    assert only(at_end(job2, after=650), "stall")


def test_compile_gap_before_the_first_steps_is_not_held_against_the_job() -> None:
    job = run(decaying(50), dt=1.0)
    for s in job.series.values():
        s.time[1:] += 960  # 16 minutes of compilation before step 1
    assert only(at_end(job, after=200), "stall") == []


def test_unlearnt_cadence_uses_the_debugger_default() -> None:
    job = run(decaying(3), dt=5.0)
    assert only(at_end(job, after=1700), "stall") == []
    assert only(at_end(job, after=1900), "stall")


@pytest.mark.parametrize(("util", "words"), [(95.0, "hung collective"), (2.0, "GPUs idle")])
def test_stall_says_which_kind_from_gpu_utilisation(util: float, words: str) -> None:
    job = run(decaying(100), dt=10.0)
    t = T0 + np.arange(200, dtype=np.float64) * 10.0
    job.series["gpu_util"] = Series("gpu_util", t, np.full(200, np.nan), np.full(200, util))
    (f,) = only(evaluate([job], Policy(), float(t[-1])), "stall")
    assert words in f.message
    assert f.evidence["gpu_util_during_silence"] == pytest.approx(util)


def test_step_clock_runs_are_never_called_stalled() -> None:
    job = run(decaying(100), clock="step")
    assert only(at_end(job, after=1e6), "stall") == []


def test_finished_jobs_are_not_judged_for_stalls() -> None:
    job = run(decaying(100), state=JobState.SUCCEEDED)
    assert only(at_end(job, after=1e5), "stall") == []


# plateau ---------------------------------------------------------------------------------

def test_flat_loss_is_a_plateau() -> None:
    rng = np.random.default_rng(1)
    flat = 11.7 + rng.normal(0, 0.01, 200)
    (f,) = only(at_end(run(flat)), "plateau")
    assert f.severity is Severity.WARNING
    assert abs(f.evidence["rel_improvement"]) < 0.01


def test_slow_but_real_improvement_is_not_a_plateau() -> None:
    # 3 % better over the later half, with noise: a late-stage LLM curve
    x = np.linspace(0, 1, 400)
    loss = 3.4 - 0.2 * x + np.random.default_rng(2).normal(0, 0.01, 400)
    assert only(at_end(run(loss)), "plateau") == []


def test_noisy_metric_without_confidence_is_not_a_plateau() -> None:
    rng = np.random.default_rng(4)
    loss = 3.0 - 0.04 * np.linspace(0, 1, 40) + rng.normal(0, 0.3, 40)
    assert only(at_end(run(loss)), "plateau") == []


def test_plateau_window_in_steps_and_max_mode() -> None:
    acc = np.concatenate([np.linspace(0.1, 0.9, 200), np.full(200, 0.9)])
    policy = Policy(rules={"plateau": RuleConfig(params={
        "metric": "acc", "mode": "max", "window_steps": 150})})
    job = run(decaying(400), extra={"acc": acc})
    (f,) = only(at_end(job, policy), "plateau")
    # the window is the last 150 steps; the accuracy rose 0.1 -> 0.9 before it: converged
    # (it said "not learning" while the spike filter took the rise for spikes below 0.9)
    assert f.evidence["metric"] == "acc" and f.evidence["window_start_step"] == 249
    assert f.severity is Severity.INFO and f.evidence["kind"] == "converged"
    # the same accuracy flat at 0.1 all along is not learning
    job = run(decaying(400), extra={"acc": np.full(400, 0.1)})
    (f,) = only(at_end(job, policy), "plateau")
    assert f.severity is Severity.WARNING and f.evidence["points"] == 151


# utilization -----------------------------------------------------------------------------

def test_idle_gpus_are_critical_and_priced() -> None:
    job = run(decaying(400), extra={"gpu_util": np.full(400, 3.0)},
              instance_type="ml.p4d.24xlarge", hourly_price=40.0)
    (f,) = only(at_end(job), "utilization")
    assert f.severity is Severity.CRITICAL
    # 30 minutes of a $40/h job at 3 % use
    assert f.evidence["wasted_usd"] == pytest.approx(40 * 0.5 * 0.97, rel=0.02)


def test_underused_gpus_warn_busy_gpus_pass() -> None:
    under = run(decaying(400), extra={"gpu_util": np.full(400, 45.0)})
    (f,) = only(at_end(under), "utilization")
    assert f.severity is Severity.WARNING
    busy = run(decaying(400), extra={"gpu_util": np.full(400, 97.0)})
    assert only(at_end(busy), "utilization") == []


# restarts --------------------------------------------------------------------------------

def test_restart_loop_without_progress_is_critical_with_its_reason() -> None:
    job = run(decaying(100), logs=[LogLine(T0 + 5, "Pod was OOMKilled (exit code 137)")])
    t_last = job.last_time()
    assert t_last is not None
    job.restart_times = [t_last + 60, t_last + 120, t_last + 180]
    job.restarts = 3
    (f,) = only(evaluate([job], Policy(), t_last + 200), "restarts")
    assert f.severity is Severity.CRITICAL
    assert "oom_killed" in f.evidence["reasons"]


def test_restarts_with_progress_between_them_are_fine() -> None:
    job = run(decaying(300))
    job.restart_times = [T0 + 500, T0 + 1500, T0 + 2500]
    job.restarts = 3
    assert only(at_end(job), "restarts") == []


# budget ----------------------------------------------------------------------------------

def test_job_budget_thresholds_and_projection() -> None:
    # $100/h, 500 records x 10 s = 1.39 h so far, planned for 3x the steps
    job = run(decaying(500), hourly_price=100.0, planned_steps=1500)
    policy = Policy(budget=Budget(per_job_usd=200.0))
    (f,) = only(at_end(job, policy), "budget")
    assert f.severity is Severity.WARNING and f.evidence["kind"] == "job>=0.5"
    policy = Policy(budget=Budget(per_job_usd=400.0))
    (f,) = only(at_end(job, policy), "budget")
    assert f.evidence["kind"] == "job-projected"
    assert f.evidence["projected_usd"] == pytest.approx(100 * 4.16, rel=0.02)
    policy = Policy(budget=Budget(per_job_usd=120.0))
    (f,) = only(at_end(job, policy), "budget")
    assert f.severity is Severity.CRITICAL


def test_account_budget_adds_up_jobs_of_the_scope_once() -> None:
    jobs = [run(decaying(360), id=f"j{i}", hourly_price=100.0, scope="acct-1") for i in range(3)]
    policy = Policy(budget=Budget(accounts=[AccountBudget(limit_usd=250.0, period="month",
                                                          scope="acct-1")]))
    now = jobs[0].last_time()
    assert now is not None
    fs = only(evaluate(jobs, policy, now), "budget")
    assert len(fs) == 1  # one account finding, not one per job
    assert fs[0].severity is Severity.CRITICAL
    assert fs[0].evidence["spent_usd"] == pytest.approx(3 * 100 * 3590 / 3600, rel=0.01)


# logs ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "kind"), [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda_oom"),
    ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42)", "nccl_timeout"),
    ("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.",
     "dataloader_killed"),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "gpu_xid"),
    ("container terminated: OOMKilled", "oom_killed"),
    ("WARNING: loss is nan, skipping batch", "nan_loss"),
    ("Traceback (most recent call last):", "traceback"),
])
def test_log_signatures(line: str, kind: str) -> None:
    job = run(decaying(50), logs=[LogLine(T0 + 100, "epoch 1 ok"), LogLine(T0 + 200, line)])
    (f,) = only(at_end(job), "logs")
    assert f.evidence["kind"] == kind
    assert f.started_at == T0 + 200


def test_log_signature_in_a_finished_job_is_info() -> None:
    job = run(decaying(50), state=JobState.FAILED,
              logs=[LogLine(T0, "CUDA out of memory. Tried to allocate")])
    (f,) = only(at_end(job), "logs")
    assert f.severity is Severity.INFO


# policy plumbing -------------------------------------------------------------------------

def test_actions_and_money_come_from_the_policy() -> None:
    loss = decaying(300)
    loss[200:] = np.nan
    job = run(loss, hourly_price=36.0)
    policy = Policy(rules={"divergence": RuleConfig(actions={Severity.CRITICAL: Action.STOP})},
                    cost=Cost())
    (f,) = only(at_end(job, policy), "divergence")
    assert f.action is Action.STOP
    # 99 records x 10 s since the onset at $36/h
    assert f.burnt_usd == pytest.approx(36 * 990 / 3600)


def test_disabled_rule_stays_silent() -> None:
    loss = decaying(300)
    loss[200:] = np.nan
    policy = Policy(rules={"divergence": RuleConfig(enabled=False)})
    assert only(at_end(run(loss), policy), "divergence") == []


def test_a_rule_that_crashes_on_one_job_does_not_blind_the_others() -> None:
    broken = run(decaying(100), id="broken")
    broken.series["loss"] = Series("loss", np.array([T0]), np.array([0.0]), np.array([1.0]))
    broken.series["step"].step[:] = np.nan  # odd, but must not take the tick down
    loss = decaying(300)
    loss[200:] = np.nan
    fs = evaluate([broken, run(loss, id="bad")], Policy(), T0 + 3000)
    assert any(f.job_id == "bad" and f.rule == "divergence" for f in fs)


@pytest.mark.parametrize("where", [slice(-2, None), slice(-4, -1)])
def test_a_spike_near_the_end_is_not_a_plateau_but_flat_stays_flat(where: slice) -> None:
    x = np.linspace(0, 1, 60)
    loss = 3.6 - 0.3 * x + np.random.default_rng(5).normal(0, 0.005, 60)
    loss[where] *= 4  # a spike, in progress or just recovered: the divergence rule's business
    assert only(at_end(run(loss)), "plateau") == []
    flat = 11.7 + np.random.default_rng(6).normal(0, 0.005, 60)
    flat[-1] *= 4
    (f,) = only(at_end(run(flat)), "plateau")
    # The spike (the last record, step 59) was set aside and the later half of the steps
    # left (29..58) judged: 30 points, none of them the spike.
    assert f.evidence["points"] == 30
    assert f.evidence["level"] < 12


def _heartbeating(minutes: float, beat_every: float = 30.0, ended: bool = False) -> Job:
    """A job logging every 10 s for 60 steps, then in an 'eval' pause for ``minutes``."""
    job = run(decaying(60), dt=10.0)
    t_last = job.last_time()
    assert t_last is not None
    bt = t_last + np.arange(0, minutes * 60 + 1, beat_every)
    nan = np.full(len(bt), np.nan)
    job.series["heartbeat"] = Series("heartbeat", bt, nan, bt - t_last)
    job.series["heartbeat/eval"] = Series("heartbeat/eval", bt.copy(), nan.copy(), bt - t_last)
    if ended:
        job.series["pause_seconds"] = Series("pause_seconds", bt[-1:] + 1, np.array([np.nan]),
                                             np.array([minutes * 60.0]))
    return job


def test_a_heartbeating_pause_is_not_a_stall_until_it_outlives_its_cap() -> None:
    job = _heartbeating(40)
    now = job.series["heartbeat"].time[-1] + 5
    assert only(evaluate([job], Policy(), now), "stall") == []
    # the heartbeat thread goes on but the evaluation is hung: past the 60 min cap
    long = _heartbeating(70)
    (f,) = only(evaluate([long], Policy(), long.series["heartbeat"].time[-1] + 5), "stall")
    assert "'eval' pause" in f.message
    # the heartbeats stopped too: the process is gone, a stall after the usual threshold
    (f,) = only(evaluate([job], Policy(), now + 900), "stall")
    assert f.severity in (Severity.WARNING, Severity.CRITICAL)


def test_finished_pauses_raise_the_learnt_threshold() -> None:
    job = _heartbeating(20, ended=True)  # a 20-minute evaluation that finished
    t = job.series["pause_seconds"].time[-1]
    # silence after it: 1.5 x 20 min = 30 min before it is a stall
    assert only(evaluate([job], Policy(), t + 25 * 60), "stall") == []
    assert only(evaluate([job], Policy(), t + 35 * 60), "stall")


def test_a_log_still_being_written_holds_a_stop_off_as_a_heartbeat_does() -> None:
    """A run that stops logging progress and goes on writing lines (a final evaluation
    or decoding pass that prints its batches, as a Joey-NMT run of the blind held-out sets
    did for 8 minutes after its last step) is alive: past 30 minutes it is a warning that
    says the log goes on, not a stop, until an hour, as for a heartbeating pause. A hang
    writes nothing: the same silence with no lines, or with lines that stopped 20 minutes
    ago, is stopped at 30 minutes."""
    from trainguard.checker.model import LogLine

    job = run(decaying(60), dt=10.0)
    t_last = job.last_time()
    assert t_last is not None
    job.logs = [LogLine(t_last + 60.0 * m, f"Decoding batch {m}/50") for m in range(1, 46)]
    now = t_last + 45 * 60 + 5
    (f,) = only(evaluate([job], Policy(), now), "stall")
    assert f.severity is Severity.WARNING and "its log goes on (45 lines" in f.message
    (f,) = only(evaluate([job.until(now)], Policy(), t_last + 61 * 60), "stall")
    assert f.severity is Severity.CRITICAL  # an hour on, and the lines stopped too
    writing = dataclasses.replace(job, logs=[LogLine(t_last + 60.0 * m, "retry")
                                             for m in range(1, 62)])
    (f,) = only(evaluate([writing], Policy(), t_last + 61 * 60 + 5), "stall")
    assert f.severity is Severity.CRITICAL  # a loop that prints on is stopped an hour on
    stopped = dataclasses.replace(job, logs=job.logs[:25])  # the last line at 25 min
    (f,) = only(evaluate([stopped], Policy(), now), "stall")
    assert f.severity is Severity.CRITICAL and "log goes on" not in f.message
    silent = dataclasses.replace(job, logs=[])
    (f,) = only(evaluate([silent], Policy(), now), "stall")
    assert f.severity is Severity.CRITICAL
