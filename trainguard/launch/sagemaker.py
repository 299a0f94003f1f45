"""SageMaker: metric definitions for emit's lines, the watch tag and the policy name.

    from trainguard.launch.sagemaker import watch
    watch(trainer, policy="research")   # a ModelTrainer (sagemaker>=2.2xx) or an Estimator
    trainer.train()                     # estimator.fit()

SageMaker applies the metric definitions (regexes) to the job's CloudWatch log lines and
publishes ``/aws/sagemaker/TrainingJobs`` metrics, which the watchdog reads. The
definitions are the text reader's own (``trainguard.adapters.local.emit_format``), kept
beside this module in ``sagemaker-metric-definitions.json``: the adapters need Python
3.11 and numpy, this helper runs on 3.9 with the standard library and the SageMaker SDK.
``python -m trainguard.launch.sagemaker`` writes the file again from the reader's
definitions, and a test fails when the two differ.
"""

from __future__ import annotations

import importlib
import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from trainguard.launch import POLICY_TAG, WATCH_TAG, check_policy_name

MAX_DEFINITIONS = 40  # CreateTrainingJob accepts at most 40 metric definitions
DEFINITIONS_FILE = "sagemaker-metric-definitions.json"


@cache
def _shipped() -> tuple[tuple[str, str], ...]:
    text = resources.files("trainguard.launch").joinpath(DEFINITIONS_FILE).read_text("utf-8")
    return tuple((d["Name"], d["Regex"]) for d in json.loads(text)["definitions"])


def metric_definitions() -> list[dict[str, str]]:
    """``[{"Name", "Regex"}]`` for emit's lines (the time field is CloudWatch's own)."""
    return [{"Name": name, "Regex": regex} for name, regex in _shipped()]


def definitions_from_reader() -> dict[str, Any]:
    """What ``sagemaker-metric-definitions.json`` must hold: the text reader's definitions
    of emit's lines less the time field (tool side: needs Python 3.11 and numpy)."""
    from trainguard.adapters.local.emit_format import EMIT_DEFINITIONS

    return {
        "generated_by": "python -m trainguard.launch.sagemaker, from "
                        "trainguard.adapters.local.emit_format.EMIT_DEFINITIONS",
        "definitions": [{"Name": d.name, "Regex": d.regex}
                        for d in EMIT_DEFINITIONS if not d.time],
    }


def tags(policy: str, tag: str = WATCH_TAG) -> list[dict[str, str]]:
    return [{"Key": tag, "Value": "true"}, {"Key": POLICY_TAG, "Value": check_policy_name(policy)}]


def _merge(existing: list[dict[str, str]], new: list[dict[str, str]], key: str, what: str,
           value: str) -> list[dict[str, str]]:
    """The user's entries plus ours; the same name with another value is an error."""
    have = {e[key]: e[value] for e in existing}
    out = list(existing)
    for entry in new:
        if entry[key] not in have:
            out.append(entry)
        elif have[entry[key]] != entry[value] and what == "metric definition":
            raise ValueError(f"{what} {entry[key]!r} is already set to {have[entry[key]]!r}; "
                             f"trainguard needs {entry[value]!r}: rename yours")
        elif have[entry[key]] != entry[value]:
            out = [entry if e[key] == entry[key] else e for e in out]  # our tag value wins
    return out


def watch(job: Any, policy: str = "default", tag: str = WATCH_TAG) -> Any:
    """Add the metric definitions and tags to an unlaunched ``ModelTrainer`` or
    ``Estimator``, in place; returns it. Existing definitions and tags are kept."""
    defs, new_tags = metric_definitions(), tags(policy, tag)
    if hasattr(job, "with_metric_definitions"):  # ModelTrainer: pydantic configs
        configs = importlib.import_module(
            "sagemaker.train.configs" if type(job).__module__.startswith("sagemaker.train")
            else "sagemaker.modules.configs")
        current = [{"Name": d.name, "Regex": d.regex}
                   for d in (getattr(job, "_metric_definitions", None) or [])]
        merged = _merge(current, defs, "Name", "metric definition", "Regex")
        _check_count(merged)
        job.with_metric_definitions([configs.MetricDefinition(name=d["Name"], regex=d["Regex"])
                                     for d in merged])
        current_tags = [{"Key": t.key, "Value": t.value} if hasattr(t, "key") else
                        {"Key": t["Key"], "Value": t["Value"]} for t in (job.tags or [])]
        job.tags = [configs.Tag(key=t["Key"], value=t["Value"])
                    for t in _merge(current_tags, new_tags, "Key", "tag", "Value")]
        return job
    if hasattr(job, "metric_definitions"):  # Estimator (sagemaker < 3): plain dicts
        merged = _merge(list(job.metric_definitions or []), defs, "Name", "metric definition",
                        "Regex")
        _check_count(merged)
        job.metric_definitions = merged
        job.tags = _merge(list(job.tags or []), new_tags, "Key", "tag", "Value")
        return job
    raise TypeError(f"trainguard.launch.sagemaker.watch: expected a sagemaker ModelTrainer or "
                    f"Estimator, got {type(job).__name__}")


def _check_count(defs: list[dict[str, str]]) -> None:
    if len(defs) > MAX_DEFINITIONS:
        raise ValueError(f"{len(defs)} metric definitions: SageMaker accepts at most "
                         f"{MAX_DEFINITIONS}; drop some of yours")


if __name__ == "__main__":  # write the shipped definitions again from the reader's
    target = Path(__file__).with_name(DEFINITIONS_FILE)
    target.write_text(json.dumps(definitions_from_reader(), indent=2) + "\n", "utf-8")
    print(f"wrote {target}")
