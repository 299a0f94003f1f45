"""Shapes of training runs the shared corpora lack, built here and replayed as a live
watchdog would see them (the default policy, ticks on the default schedule).

    .venv/bin/python bench/built_shapes.py            # every shape, a line each
    .venv/bin/python bench/built_shapes.py --only sgdr

The corpora hold modded-nanogpt speed-runs, one GAN and small runs of public projects;
the maintainers judge on runs of other recipes. These are the shapes those runs have and
the corpora do not: language-model pre-training under five learning-rate schedules and
three logging cadences (with and without loss spikes that recover, or a change of data
mixture), warm restarts,
diffusion losses, logs that begin far into a run (resumed), Hugging Face fine-tunes
(losses rounded to 4 decimals), grokking, a normalising flow whose NLL goes below zero,
a triplet loss that is mostly exactly zero, YOLO, PPO and word-level language models.
Each is labelled ``healthy`` (no critical finding of any rule at any tick is the bar; a
warning is listed), ``diverged`` (a critical ``divergence`` is the bar) or ``stuck``
(worse and staying, 1.3 x its best: a plateau warning and nothing critical).

Each line: the shape, its label, whether it met its bar, and every finding at warning or
above at any tick (rule, worst severity, first fire's step). The last lines count them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.checker import Job, Policy, Series, Severity  # noqa: E402
from trainguard.replay import replay  # noqa: E402

T0 = 1_750_000_000.0
Curves = dict[str, tuple[np.ndarray, np.ndarray]]


def job_of(series: Curves, dt: float = 1.0) -> Job:
    return Job(id="built", start_time=T0, series={
        name: Series(name, T0 + np.asarray(s, float) * dt, np.asarray(s, float),
                     np.asarray(v, float)) for name, (s, v) in series.items()})


def schedule(kind: str, n: int) -> np.ndarray:
    t = np.arange(n) / n
    warm = np.minimum(1, np.arange(n) / max(1, n // 50))
    lr = {"cosine": 0.5 * (1 + np.cos(np.pi * t)),
          "wsd": np.where(t < 0.8, 1.0, 1 - (t - 0.8) / 0.2),
          "linear": 1 - t,
          "invsqrt": 1 / np.sqrt(np.maximum(1, np.arange(n) / (n // 50))),
          "onecycle": np.where(t < 0.3, t / 0.3, 1 - (t - 0.3) / 0.7)}[kind]
    return np.asarray(np.maximum(lr * warm, 1e-3))


def pretraining(kind: str, n: int, every: int, seed: int) -> Curves:
    """Progress is the integrated learning rate; a lower rate also lowers the noise floor
    (the drop of a decay phase); with ``seed`` 1, three spikes of 1.3-3 x that decay."""
    rng = np.random.default_rng(seed)
    lr = schedule(kind, n)
    progress = np.cumsum(lr) / np.sum(lr) * n
    y = (2.0 + 8.0 * (1 + progress / (n / 100)) ** -0.5) * (1 + 0.05 * lr)
    y *= np.exp(rng.normal(0, 0.02, n))
    for _ in range(3 if seed else 0):
        at, h, w = rng.integers(n // 10, n - n // 10), rng.uniform(1.3, 3.0), rng.integers(3, 40)
        y[at:] *= 1 + (h - 1) * np.exp(-np.arange(n - at) / w)
    s = np.arange(n)[::every]
    return {"loss": (s, y[::every]), "lr": (s, lr[::every])}


def sgdr(jump_to: float, per: int) -> Curves:
    rng = np.random.default_rng(0)
    e = np.arange(per)
    y = np.concatenate([0.02 + ((2.3 if c == 0 else jump_to) - 0.02) * np.exp(-e / (per / 5))
                        for c in range(4)]) * np.exp(rng.normal(0, 0.05, 4 * per))
    s = np.arange(4 * per) * 100
    return {"train_loss": (s, y), "epoch": (s, np.arange(4 * per))}


def diffusion(first: int) -> Curves:
    s = np.arange(first, 100_000, 100)
    y = 0.05 * (1 + 0.04 * (1 + s / 5000) ** -0.5) + np.exp(-s / 300)
    return {"loss": (s, y * np.exp(np.random.default_rng(0).normal(0, 0.08, len(s))))}


def resumed(first: int) -> Curves:
    s = np.arange(first, 100_000, 50)
    y = 2.0 + 8 * (1 + s / 100) ** -0.5
    return {"loss": (s, y * np.exp(np.random.default_rng(0).normal(0, 0.02, len(s))))}


def fine_tune(epochs: int, rise: float) -> Curves:
    """Train loss every 50 steps dropping at each epoch; eval loss per epoch rising
    ``rise``-fold over the run (mild overfitting)."""
    s = np.arange(epochs * 20) * 50 + 50
    y = (0.4 + 1.6 * np.exp(-s / 300)) * 0.7 ** ((s - 1) // 1000)
    y *= np.exp(np.random.default_rng(0).normal(0, 0.05, len(s)))
    es = (np.arange(epochs) + 1) * 1000
    ev = 0.9 * rise ** (np.arange(epochs) / max(1, epochs - 1))
    return {"loss": (s, y), "eval_loss": (es, ev), "epoch": (s, s / 1000)}


def rounded(floor: float, seed: int) -> Curves:
    s = np.arange(10, 3000, 10)
    noise = np.exp(np.random.default_rng(seed).normal(0, 0.5, len(s)))
    y = (floor + 1.5 * np.exp(-s / 200)) * noise
    return {"loss": (s, np.round(y, 4))}


def triplet() -> Curves:
    rng = np.random.default_rng(0)
    s = np.arange(0, 20_000, 10)
    share = np.clip(0.6 * np.exp(-s / 3000), 0.02, 1)
    return {"loss": (s, np.where(rng.random(len(s)) < share, rng.exponential(0.2, len(s)), 0.0))}


def grokking() -> Curves:
    s = np.arange(0, 20_000, 100)
    return {"loss": (s, 4.6 * np.exp(-s / 300) + 1e-3),
            "val_loss": (s, np.where(s < 14_000, 4.6 + 2.0 * (1 - np.exp(-s / 500)), 0.05))}


def warm_up(rise: float) -> Curves:
    s = np.arange(0, 3000, 10)
    bump = 1 + (rise - 1) * np.clip(s / 300, 0, 1) * np.exp(-np.maximum(s - 300, 0) / 300)
    return {"loss": (s, (1.2 - 0.4 * (1 - np.exp(-s / 1000))) * bump)}


def flow() -> Curves:
    s = np.arange(0, 50_000, 50)
    y = -2.5 + 5.5 * (1 + s / 500) ** -0.6 + np.random.default_rng(1).normal(0, 0.03, len(s))
    return {"loss": (s, y), "val_loss": (s[::20], y[::20] + 0.05)}


def keras(seed: int) -> Curves:
    rng, e = np.random.default_rng(seed), np.arange(8)
    return {"loss": (e, 0.2 + np.exp(-e / 2)),
            "val_loss": (e, 0.35 + 0.8 * np.exp(-e / 1.5) * np.exp(rng.normal(0, 0.1, 8)))}


def yolo(seed: int) -> Curves:
    rng, e = np.random.default_rng(seed), np.arange(100)
    out: Curves = {}
    for k, a in (("box", 1.2), ("cls", 2.0), ("dfl", 1.3)):
        train = a * (0.5 + 0.5 * np.exp(-e / 20)) * np.exp(rng.normal(0, .01, 100))
        out[f"train/{k}_loss"] = (e, train)
        val = a * (0.6 + 0.5 * np.exp(-e / 15)) * np.exp(rng.normal(0, .03, 100))
        out[f"val/{k}_loss"] = (e, val)
    out["metrics/mAP50(B)"] = (e, 0.7 * (1 - np.exp(-e / 15)))
    return out


def ppo() -> Curves:
    rng, n = np.random.default_rng(0), 1000
    s = np.arange(n) * 2048
    ret = 500 * (1 - np.exp(-np.arange(n) / 200)) + rng.normal(0, 40, n)
    return {"rollout/ep_rew_mean": (s, ret),
            "train/value_loss": (s, (10 + ret) * np.exp(rng.normal(0, .3, n)))}


def word_lm() -> Curves:
    rng, e = np.random.default_rng(0), np.arange(1, 41)
    return {"train_loss": (e, 4.3 + 2.5 * np.exp(-e / 5) - 0.005 * e + rng.normal(0, .01, 40)),
            "val_loss": (e, 4.7 + 2.0 * np.exp(-e / 4) + 0.004 * np.maximum(e - 15, 0)
                         + rng.normal(0, .01, 40))}


def moves_up(every: int, after: str, n: int = 45_000) -> Curves:
    """A pre-training loss (from ln V = 10.8 to about 3.3) that at step 20,000 collapses
    to its unigram entropy (7.5), doubles, climbs by 3 over 3,000 steps, or rises to 4.2
    (1.3 x) and stays."""
    s = np.arange(0, n, every)
    rng = np.random.default_rng(0)
    y = (2.8 + 8.0 * (1 + s / 200) ** -0.6) * np.exp(rng.normal(0, 0.01, len(s)))
    late = s >= 20_000
    y[late] = {"collapses": 7.5 * np.exp(rng.normal(0, 0.01, late.sum())),
               "doubles": 2 * y[late],
               "climbs": y[late] + 3.0 * np.clip((s[late] - 20_000) / 3_000, 0, 1),
               "rises 1.3x": np.maximum(y[late], 4.2)}[after]
    return {"loss": (s, y)}


def hump() -> Curves:
    """A fine-tune's loss that stands 2.7-fold above its best for a quarter of the steps
    it has taken and comes back, as a real one in the ``runs`` corpus does (labelled
    healthy): what the shift test's wait is set by."""
    s = np.arange(50, 6_000, 50)
    y = (900 + 10_000 * np.exp(-s / 300)) * (1 + 1.7 * np.exp(-(((s - 2_550) / 200) ** 2)))
    return {"loss": (s, y * np.exp(np.random.default_rng(1).normal(0, 0.04, len(s))))}


def mixture_change() -> Curves:
    """A pre-training loss whose data mixture changes at step 20,000: it jumps 1.75-fold
    and learns the new data slowly."""
    s = np.arange(0, 45_000, 10)
    y = 2.8 + 8.0 * (1 + s / 200) ** -0.6
    late = s >= 20_000
    y[late] = 4.9 + 0.8 * (1 + (s[late] - 20_000) / 2_000) ** -0.7
    return {"loss": (s, y * np.exp(np.random.default_rng(3).normal(0, 0.01, len(s))))}


def shapes() -> Iterator[tuple[str, str, Callable[[], Curves], float]]:
    """(name, label, curves, seconds per step)."""
    for kind in ("cosine", "wsd", "linear", "invsqrt", "onecycle"):
        for every, n in ((1, 20_000), (10, 50_000), (100, 200_000)):
            for seed in (0, 1):
                yield (f"pretraining {kind} every {every}{' spikes' if seed else ''}",
                       "healthy", partial(pretraining, kind, n, every, seed), 1.0)
    for jump in (0.1, 0.3, 0.6, 1.0):
        for per in (10, 20, 50):
            yield (f"sgdr restart to {jump} every {per} epochs", "healthy",
                   partial(sgdr, jump, per), 60.0)
    for first in (0, 100, 1000, 5000):
        yield f"diffusion first logged at {first}", "healthy", partial(diffusion, first), 1.0
    for first in (5000, 50_000, 90_000):
        yield f"resumed log from step {first}", "healthy", partial(resumed, first), 1.0
    for epochs, rise in ((3, 1.2), (5, 1.8), (10, 2.5), (10, 3.5)):
        yield (f"fine-tune {epochs} epochs, eval x{rise}", "healthy",
               partial(fine_tune, epochs, rise), 1.0)
    for floor in (1e-5, 5e-5, 2e-4, 1e-3):
        for seed in (0, 1):
            yield (f"4-decimal log, floor {floor:g} s{seed}", "healthy",
                   partial(rounded, floor, seed), 1.0)
    for rise in (1.2, 1.5, 2.0, 3.0):
        yield f"warm-up lifting the loss x{rise}", "healthy", partial(warm_up, rise), 1.0
    yield "pretraining, data mixture changed at 20,000", "healthy", mixture_change, 1.0
    yield "fine-tune, a loss hump 2.7 x for a quarter of the run", "healthy", hump, 1.0
    yield "triplet loss, mostly exactly 0", "healthy", triplet, 1.0
    yield "grokking", "healthy", grokking, 1.0
    yield "normalising flow, NLL below 0", "healthy", flow, 1.0
    for seed in range(3):
        yield f"keras 8 epochs s{seed}", "healthy", partial(keras, seed), 60.0
    for seed in range(2):
        yield f"yolo 100 epochs s{seed}", "healthy", partial(yolo, seed), 120.0
    yield "ppo", "healthy", ppo, 0.01
    yield "word-level lm 40 epochs", "healthy", word_lm, 600.0
    for after in ("collapses", "doubles", "climbs", "rises 1.3x"):
        for every in (1, 10, 50):
            yield (f"pretraining {after} at 20,000, every {every}",
                   "stuck" if after == "rises 1.3x" else "diverged",
                   partial(moves_up, every, after), 1.0)


def met(label: str, seen: list[tuple[str, str, float | None]]) -> bool:
    """healthy: no critical finding; diverged: a critical divergence; stuck (worse and
    staying, below a divergence): a plateau warning and no critical finding."""
    critical = [rule for rule, sev, _ in seen if sev == "critical"]
    if label == "diverged":
        return "divergence" in critical
    return not critical and (label == "healthy" or any(r == "plateau" for r, _, _ in seen))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="only shapes whose name contains this")
    args = ap.parse_args()
    policy = Policy()
    count: dict[str, list[int]] = {}
    for name, label, curves, dt in shapes():
        if args.only and args.only not in name:
            continue
        r = replay(job_of(curves(), dt), policy)
        seen = [(h.rule, h.worst.value, h.first.step) for h in r.histories
                if h.worst.rank >= Severity.WARNING.rank]
        ok = met(label, seen)
        tally = count.setdefault(label, [0, 0])
        tally[0] += ok
        tally[1] += 1
        said = ", ".join(f"{rule} {sev} at step {step:g}" if step is not None else
                         f"{rule} {sev}" for rule, sev, step in seen) or "-"
        print(f"{name:48s} {label:8s} {'met' if ok else 'NOT MET':8s} {said}")
    for label, (good, n) in count.items():
        print(f"{label}: {good} of {n} met the bar")


if __name__ == "__main__":
    main()
