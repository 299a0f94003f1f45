"""A training loss that drops to exactly zero and stays there (``divergence_zero``): the
fine-tune that logs ``loss 0.0`` and ``grad_norm nan`` from some step on (unsloth#712,
ms-swift#2436, Time-MoE#31 show the shape), told from a loss that reaches 0.0 by
learning, from a triplet loss meeting its margins, and from one that comes back. Curves
are built in the test; the Hugging Face one is written as a ``trainer_state.json`` and
read by the real reader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from trainguard.checker import Job, Policy, Series, Severity, evaluate
from trainguard.replay import replay

T0 = 1_700_000_000.0


def job_of(loss: np.ndarray, every: float = 10.0) -> Job:
    steps = np.arange(1.0, len(loss) + 1) * every
    t = T0 + steps * 6
    return Job(id="j", start_time=T0, series={
        "step": Series("step", t, steps, steps), "loss": Series("loss", t, steps, loss)})


def divergence(job: Job) -> list[tuple[Severity, str]]:
    now = float(job.series["loss"].time[-1]) + 1.0
    return [(f.severity, f.message) for f in evaluate([job], Policy(), now)
            if f.rule == "divergence"]


def fine_tune(n: int = 400, seed: int = 0) -> np.ndarray:
    """A fine-tune's loss as Hugging Face logs it: 1.2 falling with noise, 4 decimals."""
    rng = np.random.default_rng(seed)
    return np.round(1.2 / np.sqrt(1 + np.arange(n) / 50) + rng.normal(0, 0.03, n), 4)


def test_a_loss_that_drops_to_zero_and_stays_is_critical_at_its_fifth_zero(
        tmp_path: Path) -> None:
    from trainguard.adapters.local import load_run

    loss = fine_tune()
    history = []
    for i, x in enumerate(loss.tolist()):
        step = 10 * (i + 1)
        zero = i >= 250
        history.append({"step": step, "epoch": step / 4000, "loss": 0.0 if zero else x,
                        "grad_norm": math.nan if zero else 2.5, "learning_rate": 2e-5})
    state = {"global_step": 4000, "max_steps": 4000, "log_history": history}
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state))  # grad_norm as NaN, as the Trainer writes it
    job = load_run(path)
    result = replay(job, Policy())
    (h,) = [h for h in result.histories if h.rule == "divergence"]
    assert h.worst is Severity.CRITICAL
    # the fifth zero in a row (steps 2510 ... 2550) confirms it
    assert h.first.step == 2550 and h.finding.step == 2510
    assert "loss dropped to exactly 0 from" in h.finding.message
    assert h.finding.evidence["level_before"] > 0.3


def test_a_loss_that_reaches_zero_by_learning_is_not_a_collapse() -> None:
    n = np.arange(400.0)
    # logged to 4 decimals: it comes down through 0.001 and 0.0001 to 0.0 and stays
    assert divergence(job_of(np.round(2.3 * np.exp(-n / 25), 4))) == []
    # full precision, saturating: 1e-7, 1e-8, ... and then an exact 0.0 in float
    full = 2.3 * np.exp(-n / 8)
    full[full < 1e-30] = 0.0
    assert divergence(job_of(full)) == []
    # a triplet loss meeting its margins a batch at a time: zeros among its points
    # before any long run of them
    rng = np.random.default_rng(3)
    triplet = np.maximum(0.5 * np.exp(-n / 120) + rng.normal(0, 0.05, 400), 0.0)
    triplet[300:] = 0.0
    assert (triplet[:300] == 0).any()
    assert divergence(job_of(triplet)) == []


def test_four_zeros_are_watched_and_a_collapse_that_ends_has_recovered() -> None:
    loss = fine_tune()
    loss[250:254] = 0.0  # four zeros, then back: a spike's length, no divergence
    assert [s for s, _ in divergence(job_of(loss))] == []
    loss = fine_tune()
    loss[250:260] = 0.0  # ten zeros, then training again: critical while it lasted
    fired = [h for h in replay(job_of(loss), Policy()).histories if h.rule == "divergence"]
    assert Severity.CRITICAL in {h.worst for h in fired}
    ((severity, message),) = divergence(job_of(loss))
    assert severity is Severity.INFO and "recovered at step 2610" in message


def test_a_drop_from_a_level_far_below_the_first_is_not_judged() -> None:
    """A loss that had learnt from 2.3 to below 1 % of that (0.011) and then logs 0.0 may
    be rounding or saturation: only a drop from a level learning does not reach zero
    from is a collapse."""
    n = np.arange(400.0)
    loss = 2.3 * np.exp(-n / 40) + 0.01
    loss[300:] = 0.0
    assert loss[299] < 0.01 * loss[:3].mean()
    assert divergence(job_of(loss)) == []


def test_a_lone_zero_long_before_hides_no_later_collapse() -> None:
    """A 0.0 logged once at step 500 (a rounding, a glitch) and 200 points later a
    collapse: the collapse is judged on the 64 points before it, which hold no zero. A
    second run of zeros right after the first recovered one is not judged again."""
    loss = fine_tune()
    loss[50] = 0.0
    loss[250:] = 0.0
    ((severity, message),) = divergence(job_of(loss))
    assert severity is Severity.CRITICAL and "dropped to exactly 0" in message
    loss = fine_tune()
    loss[250:260] = 0.0
    loss[280:290] = 0.0  # zeros among the 64 points before: not judged on its own
    ((severity, message),) = divergence(job_of(loss))
    assert severity is Severity.INFO and "recovered at step 2610" in message


def test_a_hinge_loss_near_its_floor_is_no_blow_up() -> None:
    """A hinge loss per batch near the end of its training: its mean falls to about zero
    while each batch is max(0, noise of 0.05), so a third of the batches are exactly 0.
    A block of it has a tiny median and spread, and five positive batches in a row
    stood "20 scales" above it: a critical blow-up of a healthy run. A block with exact
    zeros in it is measured by its largest value as well."""
    rng = np.random.default_rng(0)
    n = np.arange(20_000.0)
    loss = np.maximum(0.5 * np.exp(-n / 2_000) + rng.normal(0, 0.05, len(n)), 0.0)
    assert 0.2 < np.mean(loss[-5_000:] == 0) < 0.6
    job = job_of(loss, every=1.0)
    assert [h for h in replay(job, Policy()).histories if h.rule == "divergence"] == []
    # a real blow-up of the same loss, where its blocks hold zeros, is still one (where
    # most of a block is zero, no finite value is judged against it: README)
    assert 0 < np.mean(loss[2_000:3_000] == 0) < 0.5
    loss[3_000:] = 40.0
    fired = [h for h in replay(job_of(loss, every=1.0), Policy()).histories
             if h.rule == "divergence" and h.worst is Severity.CRITICAL]
    assert fired and fired[0].first.step is not None
    assert 3_000 <= fired[0].first.step <= 3_010


def test_a_loss_exactly_zero_from_its_second_record_is_critical() -> None:
    """A LoRA fine-tune logging 1.0778, then 0.0 with grad_norm nan from its second record
    on (a blind set's MiniCPM-V run): the one point before the zeros is their level."""
    loss = np.array([1.0778] + [0.0] * 10)
    assert [s for s, _ in divergence(job_of(loss[:5]))] != [Severity.CRITICAL]  # 4 zeros
    found = divergence(job_of(loss))
    assert found and found[0][0] is Severity.CRITICAL
    assert "dropped to exactly 0 from 1.078" in found[0][1]


def test_a_loss_exactly_zero_from_its_first_record_is_no_collapse() -> None:
    """Zeros from the first record have no level before them (``plateau`` calls such a
    loss not learning, every label masked)."""
    assert [s for s, _ in divergence(job_of(np.zeros(12)))] != [Severity.CRITICAL]


def _with_norm(loss: np.ndarray, norm: np.ndarray) -> Job:
    job = job_of(loss)
    s = job.series["loss"]
    job.series["grad_norm"] = Series("grad_norm", s.time, s.step, norm)
    return job


def test_a_loss_zero_from_its_first_record_with_a_nan_gradient_is_critical() -> None:
    """A fine-tune logging loss 0.0 with grad_norm nan from its first record (an issue
    thread's Pink run): no level before the zeros, but a gradient that is not finite at 5
    records in a row while the loss is 0 is a divergence. Followed record by record, the
    finding is the fresh judgement's at every tick; a finite norm again ends it."""
    from tests.test_divergence_follow import follow_and_compare

    n = 14
    job = _with_norm(np.zeros(n), np.full(n, math.nan))
    found = divergence(job)
    assert found and found[0][0] is Severity.CRITICAL
    assert "exactly 0 with grad_norm not finite for 5 records" in found[0][1]
    assert divergence(_with_norm(np.zeros(4), np.full(4, math.nan))) == []
    times = job.series["loss"].time
    assert follow_and_compare(job, times) > 0
    back = _with_norm(np.r_[np.zeros(8), np.full(6, 0.7)],
                      np.r_[np.full(8, math.nan), np.full(6, 1.2)])
    assert follow_and_compare(back, back.series["loss"].time) > 0
    assert [s for s, _ in divergence(back)] != [Severity.CRITICAL]


def test_nan_gradient_norms_beside_a_finite_loss_are_no_divergence() -> None:
    """fp16's loss scaler skips steps with NaN norms while it finds its scale (5 or more
    in a row at a run's start) and now and then later: the loss is finite all along."""
    loss = fine_tune(60)
    norm = np.full(60, 2.5)
    norm[:7] = math.nan
    norm[30:32] = math.inf
    job = _with_norm(loss, norm)
    assert [s for s, _ in divergence(job)] != [Severity.CRITICAL]
    from tests.test_divergence_follow import follow_and_compare
    follow_and_compare(job, job.series["loss"].time)
