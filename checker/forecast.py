"""Where a metric will be at a job's planned end, with an interval: learning-curve extrapolation.

``forecast`` has two ways to extrapolate a partial curve; both work in progress
``x = step / planned`` because a training schedule (warm-up, cosine, warm-down) is tied to
the planned steps, not to the step count.

- With a ``Prior`` learnt from past runs of the same recipe (``learn_prior``): the run is
  the recipe's curve shape ``g(x)`` shifted and stretched, ``value = a + b * g(x)``. A
  Bayesian linear fit gives (a, b): ``b`` has a prior from the past runs, so one point is
  enough, and the shape carries what a run's early points cannot show (the late drop of a
  learning-rate warm-down). The interval's quantiles are calibrated by cross-validation
  on the past runs (out-of-fold errors only), so a 90% interval is a measured 90%.
- Without one: an ensemble of parametric families (power law, exponential, log-linear;
  Domhan et al. 2015) weighted by how well each predicted the run's own latest points
  from the earlier ones (a leave-future-out backtest), with an interval scaled by that
  backtest's error. It knows nothing of schedules, so its intervals are wide on purpose.

Numpy only; a forecast takes well under a millisecond to a few milliseconds.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Forecast:
    at: float  # the step forecast for
    mean: float
    low: float
    high: float  # low..high is the interval at ``level``
    level: float
    family: str  # "prior" or the parametric families that carried the ensemble
    n_points: int  # how many observed points the forecast used


# ---------------------------------------------------------------------------------------
# The prior: a recipe's curve shape learnt from past runs


@dataclass(frozen=True)
class Prior:
    """A recipe's curve shape and calibration, learnt from its past runs by ``learn_prior``.

    ``shape`` is g on the grid ``x`` (g(1) = 0, g(0.5) = 1); ``noise`` is the spread of a
    run around its fitted shape, per bin of ``noise_edges``; ``b_mean``/``b_sd`` the prior
    of the stretch b; ``z`` out-of-fold standardised errors (actual - mean) / sd, each made
    at progress ``z_at``: the interval at progress x uses the errors made near x.
    Plain floats, so a policy file can carry one (``to_dict``/``from_dict``).
    """

    x: tuple[float, ...]
    shape: tuple[float, ...]
    noise_edges: tuple[float, ...]
    noise: tuple[float, ...]
    b_mean: float
    b_sd: float
    z: tuple[float, ...]
    z_at: tuple[float, ...]
    x_min: float = 0.02  # earlier points (step 0, the first steps) follow no shape

    def to_dict(self) -> dict[str, Any]:
        # Plain Python floats: the dict goes into YAML policy files.
        return {k: [float(x) for x in v] if isinstance(v, tuple) else float(v)
                for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Prior:
        fields = ("x", "shape", "noise_edges", "noise", "b_mean", "b_sd", "z", "z_at")
        missing = [f for f in fields if f not in d]
        if missing:
            raise ValueError(f"prior: missing field(s) {', '.join(missing)}")
        x, shape, z = (np.asarray(d[k], dtype=float) for k in ("x", "shape", "z"))
        if len(x) < 2 or len(x) != len(shape) or np.any(np.diff(x) <= 0):
            raise ValueError("prior: x must increase and match shape in length")
        if len(d["noise"]) != len(d["noise_edges"]) - 1:
            raise ValueError("prior: noise needs one entry per bin of noise_edges")
        if len(z) < 10 or len(z) != len(d["z_at"]) or not float(d["b_sd"]) > 0:
            raise ValueError("prior: z needs at least 10 entries, one z_at each, and b_sd > 0")
        return cls(
            x=tuple(map(float, x)), shape=tuple(map(float, shape)),
            noise_edges=tuple(map(float, d["noise_edges"])), noise=tuple(map(float, d["noise"])),
            b_mean=float(d["b_mean"]), b_sd=float(d["b_sd"]), z=tuple(map(float, z)),
            z_at=tuple(map(float, d["z_at"])),
            x_min=float(d.get("x_min", 0.02)),
        )

    def g(self, x: FloatArray) -> FloatArray:
        return np.interp(x, self.x, self.shape)

    def quantiles(self, x: float, probs: Sequence[float]) -> FloatArray:
        """Quantiles of the calibration errors made nearest progress ``x``.

        Beyond the sample's own tail (fewer than 3 errors past the quantile) they are
        extrapolated as a normal tail would be: a rare stop must not rest on one sample.
        """
        z = np.asarray(self.z)
        dist = np.abs(np.asarray(self.z_at) - x)
        near = z[dist <= max(0.151, float(np.sort(dist)[min(len(z), 60) - 1]))]
        p = np.asarray(probs, dtype=float)
        edge = min(3.0 / len(near), 0.5)
        q = np.quantile(near, np.clip(p, edge, 1 - edge))
        nd = NormalDist()
        for i, pi in enumerate(p):
            if min(pi, 1 - pi) < edge:
                q[i] *= nd.inv_cdf(min(pi, 1 - pi)) / nd.inv_cdf(edge)
        return np.asarray(q, dtype=float)

    def sigma(self, x: FloatArray) -> FloatArray:
        i = np.clip(np.searchsorted(self.noise_edges, x, side="right") - 1, 0, len(self.noise) - 1)
        return np.asarray(self.noise, dtype=float)[i]


#: One past run for ``learn_prior``: steps, values and its planned steps.
Curve = tuple[Sequence[float] | FloatArray, Sequence[float] | FloatArray, float]

_GRID = np.linspace(0.0, 1.0, 41)
_EDGES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_DROP_SD = 0.1  # relative uncertainty of the drop still to come
_CHECKPOINTS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # where calibration forecasts are made


def _points(step: Any, value: Any, scale: float, x_min: float) -> tuple[FloatArray, FloatArray]:
    s = np.asarray(step, dtype=float)
    v = np.asarray(value, dtype=float)
    ok = np.isfinite(s) & np.isfinite(v) & (s > 0)
    x = s[ok] / scale
    keep = x >= x_min
    return x[keep], v[ok][keep]


def _fit_shape(runs: list[tuple[FloatArray, FloatArray]], iters: int = 12) -> tuple[
        FloatArray, FloatArray, FloatArray, FloatArray]:
    """Alternating least squares for value_ij = a_i + b_i * g(x_ij), g piecewise linear.

    Each run weighs the same whatever its logging cadence; a second-difference penalty keeps
    g smooth where few runs have points. Returns g, noise per bin, a, b.
    """
    k = len(_GRID)
    xs = np.concatenate([x for x, _ in runs])
    ys = np.concatenate([y for _, y in runs])
    run_of = np.concatenate([np.full(len(x), i) for i, (x, _) in enumerate(runs)])
    per_run = np.concatenate([np.full(len(x), 1.0 / len(x)) for x, _ in runs])
    pos = np.clip(xs * (k - 1), 0, k - 1 - 1e-9)
    lo = pos.astype(int)
    frac = pos - lo
    d2 = np.diff(np.eye(k), 2, axis=0)
    g = (np.maximum(_GRID, 0.02) ** -0.5 - 1.0) / (0.5 ** -0.5 - 1.0)
    sig = np.full(len(_EDGES) - 1, 0.05)
    a = np.zeros(len(runs))
    b = np.ones(len(runs))
    bins = np.clip(np.searchsorted(_EDGES, xs, side="right") - 1, 0, len(sig) - 1)
    for _ in range(iters):
        w = per_run / sig[bins] ** 2
        gx = g[lo] * (1 - frac) + g[lo + 1] * frac
        for i in range(len(runs)):
            m = run_of == i
            design = np.stack([np.ones(m.sum()), gx[m]], axis=1) * np.sqrt(w[m])[:, None]
            coef = np.linalg.lstsq(design, ys[m] * np.sqrt(w[m]), rcond=None)[0]
            if len(runs[i][0]) < 2:  # one point fixes a only; borrow the median stretch
                coef = np.array([ys[m][0] - np.median(b) * gx[m][0], np.median(b)])
            a[i], b[i] = coef
        rows = np.zeros((len(xs), k))
        rows[np.arange(len(xs)), lo] = b[run_of] * (1 - frac)
        rows[np.arange(len(xs)), lo + 1] += b[run_of] * frac
        normal = rows.T @ (rows * w[:, None])
        lam = 1e-3 * np.trace(normal) / k
        g = np.linalg.solve(normal + lam * d2.T @ d2 + 1e-12 * np.eye(k),
                            rows.T @ (w * (ys - a[run_of])))
        g = (g - g[-1]) / (np.interp(0.5, _GRID, g) - g[-1])
        gx = g[lo] * (1 - frac) + g[lo + 1] * frac
        resid = ys - a[run_of] - b[run_of] * gx
        for j in range(len(sig)):
            r = resid[bins == j]
            sig[j] = max(float(np.sqrt(np.mean(r**2))) if len(r) > 2 else sig[j], 1e-3)
    return g, sig, a, b


def _robust_spread(v: FloatArray) -> tuple[float, float]:
    med = float(np.median(v))
    sd = 1.4826 * float(np.median(np.abs(v - med)))
    return med, max(sd, 0.05 * abs(med), 1e-6)


def _shape_prior(runs: list[tuple[FloatArray, FloatArray]], z: Sequence[float] = (),
                 z_at: Sequence[float] = ()) -> Prior:
    g, sig, _, b = _fit_shape(runs)
    b_mean, b_sd = _robust_spread(b[[len(x) >= 2 for x, _ in runs]] if len(runs) > 1 else b)
    return Prior(x=tuple(map(float, _GRID)), shape=tuple(map(float, g)), noise_edges=_EDGES,
                 noise=tuple(map(float, sig)), b_mean=b_mean, b_sd=b_sd,
                 z=tuple(z) or tuple(np.linspace(-1.645, 1.645, 11)),
                 z_at=tuple(z_at) or (0.5,) * 11)


def learn_prior(curves: Sequence[Curve], groups: Sequence[str] | None = None,
                folds: int = 5, x_min: float = 0.02) -> Prior:
    """Learn a recipe's shape and calibration from past runs (each ran to its planned steps).

    The interval is calibrated on out-of-fold forecasts: the runs are split into ``folds``
    by ``groups`` (runs of one group, e.g. seeds of one configuration, stay together), and
    each fold is forecast from the prior of the others at 20%, 30%, ... 90% of its steps.
    """
    if len(curves) < 4:
        raise ValueError(f"learn_prior: needs at least 4 past runs, got {len(curves)}")
    runs = [_points(s, v, float(p), x_min) for s, v, p in curves]
    finals = [float(y[-1]) if len(x) and x[-1] >= 0.99 else math.nan for x, y in runs]
    usable = [i for i, (x, _) in enumerate(runs) if len(x) >= 2]
    if len(usable) < 4:
        raise ValueError("learn_prior: fewer than 4 runs with two points past the start")
    names = list(groups) if groups is not None else [str(i) for i in range(len(curves))]
    fold = np.array([zlib.crc32(n.encode()) % folds for n in names])
    z: list[float] = []
    z_at: list[float] = []
    for f in range(folds):
        train = [runs[i] for i in usable if fold[i] != f]
        test = [i for i in usable if fold[i] == f and math.isfinite(finals[i])]
        if len(train) < 4 or not test:
            continue
        inner = _shape_prior(train)
        for i in test:
            x, y = runs[i]
            for c in _CHECKPOINTS:
                m = x <= c + 1e-9
                if not m.any():
                    continue
                mean, sd = _prior_fit(inner, x[m], y[m], 1.0)
                z.append((finals[i] - mean) / sd)
                z_at.append(float(x[m][-1]))
    return _shape_prior([runs[i] for i in usable], z, z_at)


def _prior_fit(prior: Prior, x: FloatArray, y: FloatArray, x_h: float) -> tuple[float, float]:
    """Mean and sd of the value at ``x_h``: Bayesian a + b*g(x), flat on a, Huber-robust."""
    gx = prior.g(x)
    sig = prior.sigma(x)
    design = np.stack([np.ones(len(x)), gx], axis=1)
    prior_prec = np.diag([1e-8, 1.0 / prior.b_sd**2])
    prior_term = prior_prec @ np.array([0.0, prior.b_mean])
    w = 1.0 / sig**2
    for _ in range(3):  # Huber reweighting: one spike must not drag the fit
        prec = prior_prec + design.T @ (design * w[:, None])
        coef = np.linalg.solve(prec, prior_term + design.T @ (w * y))
        r = np.abs(y - design @ coef) / sig
        w = np.minimum(1.0, 2.0 / np.maximum(r, 1e-12)) / sig**2
    cov = np.linalg.inv(prec)
    phi = np.array([1.0, float(prior.g(np.array([x_h]))[0])])
    var = float(phi @ cov @ phi) + float(prior.sigma(np.array([x_h]))[0]) ** 2
    # No run follows the recipe's shape exactly: the drop still to come is uncertain in
    # proportion to its size. The calibration quantiles then scale this sd to what happens.
    drop = float(coef[1]) * (float(prior.g(x[-1:])[0]) - float(phi[1]))
    var += (_DROP_SD * drop) ** 2
    # A run the recipe's shape does not describe (residuals well above the recipe's noise)
    # gets its sd scaled by the excess, as weighted least squares does with unknown scale.
    excess = float(np.mean(((y - design @ coef) / sig) ** 2)) if len(x) >= 2 else 1.0
    return float(phi @ coef), math.sqrt(max(var, 1e-12) * max(excess, 1.0))


# ---------------------------------------------------------------------------------------
# Without a prior: parametric families, weighted by a leave-future-out backtest

_FAMILIES: dict[str, tuple[FloatArray, Any]] = {
    # name: (grid of the nonlinear parameter c, basis h_c(x)); value = a + b * h_c(x)
    "pow": (np.geomspace(0.05, 2.0, 24), lambda x, c: x[None, :] ** -c[:, None]),
    "exp": (np.geomspace(0.3, 30.0, 24), lambda x, c: np.exp(-c[:, None] * x[None, :])),
    "log": (np.array([1.0]), lambda x, c: np.log(x)[None, :] * c[:, None]),
}


def _family_predict(name: str, x: FloatArray, y: FloatArray, x_h: float) -> tuple[float, float]:
    """Least-squares fit of one family (best c on its grid, refined); (prediction at x_h, rss)."""
    grid, basis = _FAMILIES[name]
    best = _family_fit(grid, basis, x, y)
    if len(grid) > 1:  # a finer grid between the best one's neighbours
        i = int(np.argmin(np.abs(grid - best[0])))
        best = _family_fit(np.linspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 33),
                           basis, x, y)
    c, a, b, rss = best
    return float(a + b * basis(np.array([x_h]), np.array([c]))[0, 0]), rss


def _family_fit(cs: FloatArray, basis: Any, x: FloatArray, y: FloatArray) -> tuple[
        float, float, float, float]:
    """(c, a, b, rss) of the best c in ``cs`` for value = a + b * basis(x, c)."""
    h = basis(x, cs)  # (len(cs), n)
    hm = h.mean(axis=1, keepdims=True)
    ym = y.mean()
    sxx = ((h - hm) ** 2).sum(axis=1)
    b = ((h - hm) * (y - ym)).sum(axis=1) / np.maximum(sxx, 1e-300)
    a = ym - b * hm[:, 0]
    rss = ((y[None, :] - a[:, None] - b[:, None] * h) ** 2).sum(axis=1)
    k = int(np.argmin(rss))
    return float(cs[k]), float(a[k]), float(b[k]), float(rss[k])


def _generic(x: FloatArray, y: FloatArray, x_h: float, level: float) -> tuple[
        float, float, float, str] | None:
    n = len(x)
    if n < 5:
        return None
    # Leave-future-out backtest: from the first half (and first three quarters) of the
    # points, predict the last point. A family's error per unit of log-progress it had to
    # extrapolate is its weight and, scaled to the distance to the horizon, its interval.
    cuts = sorted({max(3, n // 2), max(3, (3 * n) // 4)} - {n})
    rate: dict[str, float] = {}
    for f in _FAMILIES:
        errs = [abs(_family_predict(f, x[:k], y[:k], float(x[-1]))[0] - y[-1])
                / max(math.log(x[-1] / x[k - 1]), 1e-3) for k in cuts]
        rate[f] = float(np.mean(errs)) + 1e-9
    weight = {f: 1.0 / r**2 for f, r in rate.items()}
    total = sum(weight.values())
    fits = {f: _family_predict(f, x, y, x_h) for f in _FAMILIES}
    mean = sum(weight[f] * fits[f][0] for f in _FAMILIES) / total
    spread = math.sqrt(sum(weight[f] * (fits[f][0] - mean) ** 2 for f in _FAMILIES) / total)
    reach = math.log(max(x_h, x[-1]) / x[-1])
    best = min(rate, key=rate.__getitem__)
    noise = math.sqrt(fits[best][1] / max(n - 3, 1))
    sd = math.sqrt(spread**2 + (rate[best] * reach) ** 2 + noise**2)
    # Two backtests say little about the tails: widen as a t-distribution with few
    # degrees of freedom would.
    zq = NormalDist().inv_cdf(0.5 + level / 2) * 1.5
    family = "+".join(f for f in sorted(_FAMILIES, key=lambda f: -weight[f])
                      if weight[f] / total >= 0.2)
    return mean, mean - zq * sd, mean + zq * sd, family


# ---------------------------------------------------------------------------------------


def forecast(step: npt.ArrayLike, value: npt.ArrayLike, horizon: float,
             planned: float | None = None, level: float = 0.9,
             prior: Prior | None = None) -> Forecast | None:
    """The metric at step ``horizon`` with an interval at ``level``; None when too few points.

    ``planned`` (the planned steps) sets the progress scale x = step / planned; without it
    the horizon does. With a ``prior`` one observed point past ``prior.x_min`` is enough;
    without, the parametric ensemble needs five.
    """
    if not 0 < level < 1:
        raise ValueError(f"forecast: level must be in (0, 1), got {level}")
    if not horizon > 0:
        raise ValueError(f"forecast: horizon must be a positive step, got {horizon}")
    scale = float(planned) if planned else float(horizon)
    x_h = min(float(horizon) / scale, 1.0) if prior is not None else float(horizon) / scale
    if prior is not None:
        x, y = _points(step, value, scale, prior.x_min)
        if len(x) == 0:
            return None
        mean, sd = _prior_fit(prior, x, y, x_h)
        lo_q, hi_q = prior.quantiles(float(x[-1]), [(1 - level) / 2, (1 + level) / 2])
        return Forecast(at=float(horizon), mean=mean, low=mean + sd * float(lo_q),
                        high=mean + sd * float(hi_q), level=level, family="prior",
                        n_points=len(x))
    x, y = _points(step, value, scale, 0.0)
    out = _generic(x, y, x_h, level)
    if out is None:
        return None
    mean, low, high, family = out
    return Forecast(at=float(horizon), mean=mean, low=low, high=high, level=level,
                    family=family, n_points=len(x))
