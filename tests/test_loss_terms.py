"""A term of the loss is not the objective: a VAE's KL term wakes up and grows 80-fold as
the posterior starts to use the latent, a mixture-of-experts' balancing loss steps up
50-fold as routing changes, while the objective (the total the optimiser minimises) is
fine. Their finite blow-ups are warnings naming the term; the objective's own blow-up, and
a NaN anywhere in training, stay critical. Curves built here."""

from __future__ import annotations

import numpy as np

from tests.test_rules_general import job_of
from trainguard.checker.metrics import is_term
from trainguard.checker.model import Job, Severity
from trainguard.config import default_policy
from trainguard.replay import replay

N = 400
STEPS = np.arange(N) * 10.0
IDX = np.arange(N)


def _found(job: Job) -> list[tuple[str, Severity, str]]:
    return [(h.rule, h.worst, h.finding.message) for h in replay(job, default_policy()).histories]


def _vae() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    recon = 60 + 40 * np.exp(-IDX / 60) + rng.standard_normal(N)
    kl = 0.3 + 25 * (1 - np.exp(-np.maximum(IDX - 20, 0) / 10)) * (IDX > 20)
    kl += 0.1 * rng.standard_normal(N)
    total = recon + np.minimum(IDX / 120, 1.0) * kl  # KL annealed in
    return {"loss": (STEPS, total), "recon_loss": (STEPS, recon), "kl_loss": (STEPS, kl)}


def _moe() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    aux = np.where(IDX < 150, 0.001, 0.05) + 0.0001 * rng.standard_normal(N)
    return {"loss": (STEPS, 2 + 8 / (1 + IDX / 30) + aux), "aux_loss": (STEPS, aux)}


def test_a_vae_kl_term_waking_up_is_a_warning_naming_the_term() -> None:
    found = _found(job_of(_vae()))
    divergence = [f for f in found if f[0] == "divergence"]
    assert divergence and max(f[1].rank for f in divergence) == Severity.WARNING.rank
    assert any("kl_loss" in m and "a term of the loss" in m for _, _, m in divergence)


def test_a_balancing_loss_stepping_up_is_not_a_stop() -> None:
    found = _found(job_of(_moe()))
    assert [f for f in found if f[1] is Severity.CRITICAL] == []
    assert any(f[0] == "divergence" and "aux_loss" in f[2] for f in found)


def test_the_objectives_own_blow_up_is_still_critical() -> None:
    series = _vae()
    steps, total = series["loss"]
    total = total.copy()
    total[300:] *= 40  # the total itself, 40-fold and staying there
    series["loss"] = (steps, total)
    assert ("divergence", Severity.CRITICAL) in [f[:2] for f in _found(job_of(series))]


def test_a_nan_in_a_term_is_still_critical() -> None:
    series = _moe()
    steps, aux = series["aux_loss"]
    aux = aux.copy()
    aux[300:] = np.nan
    series["aux_loss"] = (steps, aux)
    assert ("divergence", Severity.CRITICAL) in [f[:2] for f in _found(job_of(series))]


def test_what_is_a_term() -> None:
    assert [n for n in ("kl_loss", "aux_loss", "train/box_loss", "recon_loss",
                        "train_gen_loss", "loss", "train_loss", "train_loss_step",
                        "train_loss_epoch", "train/loss", "val_loss", "val/box_loss")
            if is_term(n)] == ["kl_loss", "aux_loss", "train/box_loss", "recon_loss",
                               "train_gen_loss"]
