"""A Hugging Face ``trainer_state.json`` written in a test as the Trainer writes it, and
read back by the real reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainguard.adapters.local import load_run
from trainguard.checker.model import Job


def trainer_state(folder: Path, history: list[dict[str, Any]], max_steps: int) -> Job:
    """``folder/trainer_state.json`` holding ``history`` as its ``log_history``, read."""
    path = folder / "trainer_state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    global_step = max((int(e["step"]) for e in history), default=0)
    path.write_text(json.dumps({"global_step": global_step, "max_steps": max_steps,
                                "log_history": history}))
    job = load_run(path)
    assert isinstance(job, Job)
    return job
