"""Hugging Face ``trainer_state.json``: ``log_history`` entries of step, loss, eval_loss,
learning_rate, grad_norm and epoch; ``max_steps`` is the planned steps. No timestamps, so
the clock is the step.

A Trainer's output folder is one run: each ``checkpoint-N/`` holds the state as it was at
step N, so the run is read from the latest state (the highest ``global_step``; a
``trainer_state.json`` of the folder itself, from ``trainer.save_state()``, counts too).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trainguard.adapters.local.base import Reader, RunBuilder, head, open_text, plain_name
from trainguard.adapters.local.definitions import MetricDefinition
from trainguard.adapters.local.errors import FormatError
from trainguard.checker.model import JobState

# the Trainer's end-of-training summary entry; its presence means train() returned
_SUMMARY = "train_runtime"
_NOT_SERIES = frozenset({"step", "total_flos"})


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "infinity",
                                                            "-infinity"):
        return float(value)
    return None


def states(folder: Path) -> list[Path]:
    """The trainer states of an output folder: its own and each ``checkpoint-N``'s."""
    found = [folder / "trainer_state.json"] if (folder / "trainer_state.json").is_file() else []
    return found + sorted(folder.glob("checkpoint-*/trainer_state.json"))


def _global_step(path: Path) -> float:
    """The step a state was saved at: ``global_step`` (the folder's N when unreadable)."""
    try:
        with open_text(path) as f:
            value = _number(json.loads(f.read()).get("global_step"))
        if value is not None:
            return value
    except (ValueError, AttributeError, FormatError):
        pass
    tail = path.parent.name.rpartition("-")[2]
    return float(tail) if tail.isdigit() else -1.0


def latest_state(folder: Path) -> Path:
    found = states(folder)
    if not found:
        raise FormatError(folder, "no trainer_state.json in this folder or its checkpoint-N "
                          "folders")
    # the latest by step, and by time written between equal steps
    return max(found, key=lambda p: (_global_step(p), p.stat().st_mtime_ns))


class HuggingFaceReader(Reader):
    name = "hf"

    def matches_name(self, path: Path) -> bool:
        if path.is_dir():
            return bool(states(path))
        return plain_name(path) == "trainer_state.json"

    def matches_content(self, path: Path) -> bool:
        return path.is_file() and '"log_history"' in head(path, 65536)

    def default_id(self, path: Path) -> str:
        # output/checkpoint-500/trainer_state.json is the run "checkpoint-500"
        if path.is_dir():
            return path.name
        return path.parent.name or super().default_id(path)

    def collect(self, path: Path, run: RunBuilder, definitions: list[MetricDefinition] | None,
                select: str | None) -> None:
        if path.is_dir():
            path = latest_state(path)
        with open_text(path) as f:
            text = f.read()
        if not text.strip():
            return
        try:
            state = json.loads(text)
        except json.JSONDecodeError as e:
            raise FormatError(path, f"not valid JSON: {e.msg}", e.lineno) from None
        if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
            raise FormatError(path, "no 'log_history' list: not a trainer_state.json")
        max_steps = _number(state.get("max_steps"))
        if max_steps is not None and math.isfinite(max_steps) and max_steps > 0:
            run.planned_steps = int(max_steps)
        for i, entry in enumerate(state["log_history"]):
            if not isinstance(entry, dict):
                raise FormatError(path, f"log_history[{i}]: expected an object")
            step = _number(entry.get("step"))
            step = math.nan if step is None else step
            if _SUMMARY in entry:
                run.state = JobState.SUCCEEDED
                run.raw_state = "train_runtime logged"
                continue  # run averages, not points of a curve
            for key, value in entry.items():
                v = _number(value)
                if v is not None and key not in _NOT_SERIES:
                    run.add(key, v, step, row=i)
        global_step = _number(state.get("global_step"))
        if global_step is not None and not run.kind:
            run.add("step", global_step, global_step, row=0)
