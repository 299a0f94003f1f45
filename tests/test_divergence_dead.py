"""A run whose gradient died (``divergence_dead``): the gradient norm it logs, positive
before, exactly 0 record after record while the loss stands far above its best.

The failure class, seen on a held-out TinyLlama retrofit: its loss climbed from 7.6 to 24
(3.2 x its best, under the ratio test's 5 x) and sat there with ``grad_norm`` 0.0 at each
of its last 34 records. No NaN reaches the loss and no ratio test fires: trainguard warned
"not learning" and did not stop it, where no gradient means the loss cannot come back.
Told apart from a norm some DeepSpeed set-ups log as 0 from the first record, a lone 0
(a skipped step), a converged loss sitting still, and a gradient that comes back. Curves
are built in the test; Hugging Face ones are written as ``trainer_state.json`` or as the
Trainer's console lines and read by the real readers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.afresh import histories, judged_afresh
from tests.hf_state import trainer_state
from trainguard.adapters.local import load_run
from trainguard.checker import Policy, Severity
from trainguard.checker.evaluate import evaluate
from trainguard.checker.metrics import grad_norm
from trainguard.checker.model import Finding, Job, Series
from trainguard.checker.rules.divergence_dead import Dead
from trainguard.checker.rules.divergence_state import DivergenceParams
from trainguard.replay import replay

T0 = 1_700_000_000.0


def retrofit(n: int = 200, dead_from: int = 150, seed: int = 0) -> tuple[np.ndarray,
                                                                        np.ndarray]:
    """(loss, grad_norm): a language model learning from 8 to about 2.5, climbing to about 6
    (2.4 x its best; back up less than the undo test's 80 % of what it had learnt) from
    record ``dead_from - 10``, and stuck there with a norm of 0 from ``dead_from`` on."""
    rng = np.random.default_rng(seed)
    k = np.arange(n, dtype=float)
    loss = 2.5 + 5.5 * np.exp(-k / 30) + rng.normal(0, 0.05, n)
    climb = np.clip((k - (dead_from - 10)) / 10, 0, 1)
    loss = np.round(loss + 3.5 * climb, 4)
    norm = np.round(1.0 + rng.random(n), 4)
    norm[dead_from:] = 0.0
    return loss, norm


def job_of(loss: np.ndarray, norm: np.ndarray) -> Job:
    steps = np.arange(1.0, len(loss) + 1) * 10
    t = T0 + steps * 6
    return Job(id="j", start_time=T0, series={
        "step": Series("step", t, steps, steps), "loss": Series("loss", t, steps, loss),
        "grad_norm": Series("grad_norm", t, steps, norm)})


def divergence(job: Job) -> list[Finding]:
    now = float(job.series["loss"].time[-1]) + 1.0
    return [f for f in evaluate([job], Policy(), now) if f.rule == "divergence"]


def test_a_loss_frozen_far_above_its_best_with_a_zero_gradient_is_critical(
        tmp_path: Path) -> None:
    loss, norm = retrofit()
    history = [{"step": 10 * (i + 1), "loss": x, "grad_norm": g, "learning_rate": 1e-4}
               for i, (x, g) in enumerate(zip(loss.tolist(), norm.tolist(), strict=True))]
    job = trainer_state(tmp_path, history, max_steps=2000)
    result = replay(job, Policy())
    (h,) = [h for h in result.histories if h.rule == "divergence"]
    assert h.worst is Severity.CRITICAL
    assert h.finding.evidence["kind"] == "dead_gradient"
    assert h.finding.step == 1510  # the first zero
    assert h.first.step == 1550  # its 5th: recover_points zeros in a row
    assert "grad_norm exactly 0" in h.finding.message and "2.4x its best" in h.finding.message
    # the same curve with its gradient alive: the climb alone is under every ratio test
    alive = [dict(e, grad_norm=1.5) for e in history]
    job = trainer_state(tmp_path / "alive", alive, max_steps=2000)
    assert not [h for h in replay(job, Policy()).histories
                if h.rule == "divergence" and h.worst is Severity.CRITICAL]


def test_zero_norms_that_say_nothing_stop_nothing() -> None:
    """Also the attack: whoever can write a job's gradient norm (a forged series of
    zeros) but not its loss cannot get a learning job stopped."""
    loss, _ = retrofit(dead_from=10_000)  # learns, never climbs
    deepspeed = np.zeros(len(loss))  # logged as 0 from the first record
    spiky = loss.copy()
    spiky[120:126] *= 2.5  # a spike the run comes back from, under a norm of 0
    lone = np.round(1.0 + np.random.default_rng(1).random(len(loss)), 4)
    lone[::7] = 0.0  # single skipped steps
    forged = lone.copy()
    forged[100:] = 0.0  # zeros from record 100 on while the loss learns
    converged = np.full(len(loss), 1.2)  # the norm
    converged[150:] = 0.0  # a still loss at its best, its gradient gone
    for curve, norm in ((spiky, deepspeed), (loss, lone), (loss, forged),
                        (np.round(np.concatenate([loss[:150], np.full(50, loss[140])]), 4),
                         converged)):
        found = divergence(job_of(curve, norm))
        assert not [f for f in found if f.severity is Severity.CRITICAL], found


def test_the_gradient_coming_back_has_recovered_and_a_replay_agrees() -> None:
    loss, norm = retrofit(n=260)
    norm[190:] = 1.3  # alive again at record 190
    loss[190:] = np.round(2.6 + np.linspace(0.1, 0.0, 70), 4)  # and learning again
    job = job_of(loss, norm)
    (f,) = divergence(job)
    assert f.severity is Severity.INFO and f.evidence["kind"] == "recovered"
    assert "grad_norm exactly 0 for 40 records" in f.message and "recovered at step 1910" \
        in f.message
    r = replay(job, Policy(), 60.0)
    assert r.times is not None
    assert histories(r) == judged_afresh(job, Policy(), r.times.tolist())
    assert r.rule_runs < r.rule_calls  # the norm's band let the followers keep answers
    fired = {h.key.rsplit("/", 1)[1]: h for h in r.histories if h.rule == "divergence"}
    assert fired["dead_gradient"].worst is Severity.CRITICAL
    assert fired["dead_gradient"].first.step == 1550
    assert fired["recovered"].first.step == 1950  # recover_points norms after it


def test_fed_at_once_or_record_by_record_the_same_runs() -> None:
    """``check`` reads a run at once (numpy), a replay record by record; a NaN norm (an
    fp16 step skipped) inside a run of zeros neither extends nor ends it."""
    loss, norm = retrofit(n=260)
    norm[170] = np.nan
    norm[200:] = 0.9
    steps = np.arange(len(loss), dtype=float)
    g, obj = Series("g", steps, steps, norm), Series("loss", steps, steps, loss)
    p = DivergenceParams()
    at_once, one_by_one = Dead(), Dead()
    at_once.read(g, obj, p)
    for n in range(1, len(loss) + 1):
        cut = slice(0, n)
        one_by_one.read(Series("g", steps[cut], steps[cut], norm[cut]),
                        Series("loss", steps[cut], steps[cut], loss[cut]), p)
        one_by_one.verdict(Series("g", steps[cut], steps[cut], norm[cut]),
                           Series("loss", steps[cut], steps[cut], loss[cut]), 0.0, p)
    a, b = at_once.fired, one_by_one.fired
    assert a is not None and b is not None
    assert (a.first, a.last, a.length, a.back, a.at) == (b.first, b.last, b.length, b.back,
                                                         b.at) == (150, 199, 49, 200, 150)
    assert a.after == b.after == 60


def test_the_trainers_console_lines_and_nanogpt_lines_give_the_norm(tmp_path: Path) -> None:
    """The Trainer prints ``{'loss': 7.3, 'grad_norm': 26.09, ...}`` to its console; the
    log of such a run is judged as its ``trainer_state.json`` would be. build-nanogpt and
    llm.c print ``| norm: 0.2843 |``."""
    loss, norm = retrofit()
    console = tmp_path / "train.log"
    console.write_text("".join(
        f"{{'loss': {x}, 'grad_norm': {g}, 'learning_rate': 0.0001, 'epoch': {i / 100}}}\n"
        for i, (x, g) in enumerate(zip(loss.tolist(), norm.tolist(), strict=True))))
    job = load_run(console)
    g = grad_norm(job)
    assert g is not None and g.name == "grad_norm" and g.value.tolist() == norm.tolist()
    (f,) = [f for f in evaluate([job], Policy(), float(job.series["loss"].time[-1]) + 1)
            if f.rule == "divergence"]
    assert f.severity is Severity.CRITICAL and f.evidence["kind"] == "dead_gradient"
    nanogpt = tmp_path / "nanogpt.out"
    nanogpt.write_text("".join(
        f"step {i:5d} | loss: {x:.6f} | lr 6.0000e-04 | norm: {g:.4f} | dt: 310.2ms\n"
        for i, (x, g) in enumerate(zip(loss.tolist(), norm.tolist(), strict=True))))
    g = grad_norm(load_run(nanogpt))
    assert g is not None and g.value.tolist() == np.round(norm, 4).tolist()


def test_the_total_norm_is_read_before_its_statistics() -> None:
    t = np.arange(3.0)
    job = Job(id="j", start_time=0.0, series={
        k: Series(k, t, t, t) for k in ("grad_norm_max", "train/grad_norm", "weight_norm",
                                        "layer_norm")})
    g = grad_norm(job)
    assert g is not None and g.name == "train/grad_norm"
