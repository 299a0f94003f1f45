"""A small real training run for the demo: a one-hidden-layer MLP trained with minibatch
gradient descent in numpy on scikit-learn's ``load_digits`` (8x8 digits, 10 classes).

Each mode is ordinary training code with one bad setting, the way real runs go wrong:

- ``healthy``: a sensible learning rate;
- ``diverge``: a learning rate far too high: the weights blow up until float32 overflows
  and the loss turns NaN (the loop goes on, as real loops do);
- ``nolearn``: the weights start at zero (a "dead" init): every hidden unit is zero, so no
  gradient reaches the weights and the loss stays at ln(10);
- ``hang``: the data loader's worker thread dies on a corrupt record, and the training
  loop waits for its next batch forever: alive, silent.

Every step appends ``{"time", "step", "loss"}`` (and ``val_loss`` every few steps) as one
JSON line, flushed at once, and sleeps to stretch the run to demo length.

    python -m trainguard.demo.train --mode healthy --out run.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float32]
LEAK = 0.01


@dataclass(frozen=True)
class Setting:
    lr: float
    init_scale: float  # times He's sqrt(2 / fan_in); 0 is the dead init
    corrupt_at_batch: int | None = None  # the loader meets a corrupt record here


MODES: dict[str, Setting] = {
    "healthy": Setting(lr=0.05, init_scale=1.0),
    "diverge": Setting(lr=25.0, init_scale=1.0),
    "nolearn": Setting(lr=0.05, init_scale=0.0),
    "hang": Setting(lr=0.05, init_scale=1.0, corrupt_at_batch=90),
}


def load_data(seed: int) -> tuple[Array, npt.NDArray[np.int64], Array, npt.NDArray[np.int64]]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    n_val = len(y) // 6
    return x[n_val:], y[n_val:], x[:n_val], y[:n_val]


class Loader:
    """Batches prepared by a worker thread ahead of the training loop, as a DataLoader does.

    A record the worker cannot decode kills the worker; the loop's ``get`` has no timeout,
    so it waits for a batch that will never come.
    """

    def __init__(self, x: Array, y: npt.NDArray[np.int64], batch: int, seed: int,
                 corrupt_at_batch: int | None) -> None:
        self.x, self.y, self.batch = x, y, batch
        self.rng = np.random.default_rng(seed)
        self.corrupt_at = corrupt_at_batch
        self.queue: queue.Queue[tuple[Array, npt.NDArray[np.int64]]] = queue.Queue(maxsize=4)
        threading.Thread(target=self._work, daemon=True).start()

    def _records(self) -> Iterator[tuple[Array, int]]:
        n = 0
        while True:
            for i in self.rng.permutation(len(self.y)):
                n += 1
                if self.corrupt_at is not None and n == self.corrupt_at * self.batch:
                    yield self.x[i][:37], int(self.y[i])  # a truncated record on disk
                else:
                    yield self.x[i], int(self.y[i])

    def _work(self) -> None:
        records = self._records()
        while True:
            rows = [next(records) for _ in range(self.batch)]
            xb = np.stack([r[0] for r in rows])  # raises on the truncated record: worker dies
            self.queue.put((xb, np.array([r[1] for r in rows])))

    def __iter__(self) -> Iterator[tuple[Array, npt.NDArray[np.int64]]]:
        while True:
            yield self.queue.get()


class MLP:
    def __init__(self, n_in: int, n_hidden: int, n_out: int, init_scale: float,
                 rng: np.random.Generator) -> None:
        he = init_scale * math.sqrt(2.0 / n_in)
        self.w1 = (rng.standard_normal((n_in, n_hidden)) * he).astype(np.float32)
        self.b1 = np.zeros(n_hidden, np.float32)
        self.w2 = (rng.standard_normal((n_hidden, n_out)) * init_scale
                   * math.sqrt(2.0 / n_hidden)).astype(np.float32)
        self.b2 = np.zeros(n_out, np.float32)

    def loss(self, x: Array, y: npt.NDArray[np.int64]) -> tuple[float, Array, Array]:
        """Mean cross-entropy, the hidden activations and d(loss)/d(logits)."""
        z = x @ self.w1 + self.b1
        h = np.where(z > 0, z, LEAK * z)  # leaky ReLU, PyTorch's default slope
        logits = h @ self.w2 + self.b2
        shifted = logits - logits.max(axis=1, keepdims=True)  # inf - inf = NaN on overflow
        logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        loss = float(-logp[np.arange(len(y)), y].mean())
        grad = np.exp(logp)
        grad[np.arange(len(y)), y] -= 1.0
        return loss, h, (grad / len(y)).astype(np.float32)

    def step(self, x: Array, y: npt.NDArray[np.int64], lr: float) -> float:
        loss, h, g = self.loss(x, y)
        dh = (g @ self.w2.T) * np.where(h > 0, 1.0, LEAK).astype(np.float32)
        self.w2 -= lr * (h.T @ g)
        self.b2 -= lr * g.sum(axis=0)
        self.w1 -= lr * (x.T @ dh)
        self.b1 -= lr * dh.sum(axis=0)
        return loss


def train(mode: str, out: IO[str], steps: int, interval_s: float, seed: int,
          val_every: int = 5, batch: int = 32) -> None:
    setting = MODES[mode]
    x, y, xv, yv = load_data(seed)
    rng = np.random.default_rng(seed)
    model = MLP(x.shape[1], 32, 10, setting.init_scale, rng)
    loader = Loader(x, y, batch, seed, setting.corrupt_at_batch)
    batches = iter(loader)
    with np.errstate(all="ignore"):  # overflow is what the diverging run is about
        for step in range(1, steps + 1):
            started = time.monotonic()
            xb, yb = next(batches)
            record: dict[str, float | int] = {"step": step, "loss": model.step(xb, yb, setting.lr)}
            if step % val_every == 0:
                record["val_loss"] = model.loss(xv, yv)[0]
            record["time"] = time.time()
            out.write(json.dumps(record) + "\n")  # NaN is written as NaN, as json does
            out.flush()
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=sorted(MODES), required=True)
    ap.add_argument("--out", required=True, help="the JSON lines file to append to")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--interval", type=float, default=0.18, help="seconds per step (throttle)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    with open(args.out, "a", encoding="utf-8") as out:
        train(args.mode, out, args.steps, args.interval, args.seed)


if __name__ == "__main__":
    main()
