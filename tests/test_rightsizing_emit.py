"""GPU memory written by ``trainguard.emit`` (``gpu_mem_used_gb``, from
``torch.cuda.max_memory_allocated``) reaches the ``rightsizing`` rule through the log
reader, as a job's own log would."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np

from trainguard.adapters.local import load_run
from trainguard.checker.evaluate import evaluate
from trainguard.checker.model import JobState, Series
from trainguard.checker.policy import Policy
from trainguard.checker.rules.rightsizing import Rightsizing
from trainguard.emit import Emitter

T0 = 1_750_000_000.0


def _emitted_log(tmp_path: Path, peak_gb: float) -> Path:
    clock = {"now": T0}
    out = io.StringIO()
    em = Emitter(interval=0.0, stream=out, clock=lambda: clock["now"])
    for i in range(200):  # one line a minute for 3 h 20 min
        clock["now"] = T0 + 60.0 * i
        em.emit(step=i * 50, loss=3.0 - i * 0.001, gpu_mem_used_gb=peak_gb)
    path = tmp_path / "train.log"
    path.write_text(out.getvalue())
    return path


def _judge(path: Path) -> list:  # type: ignore[type-arg]
    job = load_run(path)
    job = dataclasses.replace(job, state=JobState.RUNNING, instance_type="ml.p4d.24xlarge",
                              instance_count=1, gpus_per_instance=8)
    t = job.series["gpu_mem_used_gb"].time
    # the GPU use the platform reports: light
    job.series["gpu_util"] = Series("gpu_util", t, np.full(len(t), np.nan),
                                    np.full(len(t), 30.0))
    return evaluate([job], Policy(), float(t[-1]), rules=[Rightsizing()])


def test_emitted_gpu_memory_is_read_and_names_a_cheaper_type(tmp_path: Path) -> None:
    path = _emitted_log(tmp_path, 9.5)
    assert "gpu_mem_used_gb=9.5" in path.read_text()
    [f] = _judge(path)
    assert f.evidence["peak_gpu_mem_gb"] == 9.5
    assert f.evidence["suggested_type"] != "ml.p4d.24xlarge"


def test_emitted_gpu_memory_near_the_top_keeps_it_silent(tmp_path: Path) -> None:
    assert _judge(_emitted_log(tmp_path, 36.0)) == []
