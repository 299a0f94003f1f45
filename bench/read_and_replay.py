"""Read the largest shared log, and replay it tick by tick, timed.

    python bench/read_and_replay.py [--curves DIR | --log FILE] [--repeat 5]

Prints the best of ``--repeat`` wall times for ``adapters.local.load_run`` on the longest
modded-nanogpt log (or ``--log``, any log the reader reads), and for
``trainguard.replay.replay`` of it at a 60 s and a 300 s tick with the default policy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.adapters.local import load_run  # noqa: E402
from trainguard.checker.evaluate import build_rules  # noqa: E402
from trainguard.config import default_policy  # noqa: E402
from trainguard.replay import replay  # noqa: E402


def best(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--curves", type=Path, default=ROOT.parent / "shared" / "data" / "curves")
    ap.add_argument("--log", type=Path, help="time this log instead")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    logs = ([a.log] if a.log else
            sorted((a.curves / "modded-nanogpt").glob("*.log"), key=lambda p: p.stat().st_size))
    if not logs:
        sys.exit(f"no modded-nanogpt logs under {a.curves}")
    path = logs[-1]
    lines = sum(1 for _ in path.open())
    read = best(lambda: load_run(path), a.repeat)
    job = load_run(path)
    policy = default_policy()
    rules = build_rules(policy)
    print(f"{path.name}: {lines} lines, read in {read * 1e3:.0f} ms (best of {a.repeat})")
    for tick in (60.0, 300.0):
        result = replay(job, policy, tick, rules)
        took = best(lambda t=tick: replay(job, policy, t, rules), a.repeat)
        print(f"replay at a {tick:g} s tick: {result.ticks} ticks in {took * 1e3:.0f} ms "
              f"(best of {a.repeat}), {len(result.histories)} findings")


if __name__ == "__main__":
    main()
