"""What a job's pods say: restarts, why containers died, where they run.

Kubernetes keeps only the last termination of each container while its
``restartCount`` counts them all. ``restart_times`` is given only when it accounts for
every restart: a crash-looping container (five restarts, one known time) would
otherwise look like a single restart to the restarts rule, which trusts times over
the count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainguard.adapters.kubeflow.fields import Reader
from trainguard.adapters.kubeflow.kinds import instance_type_of
from trainguard.checker.model import LogLine


@dataclass
class PodFacts:
    pods: int = 0
    restarts: int = 0
    restart_times: list[float] = field(default_factory=list)
    logs: list[LogLine] = field(default_factory=list)
    instance_types: set[str] = field(default_factory=set)
    first_start: float | None = None


def read_pods(pods: list[Any], owner: str) -> PodFacts:
    facts = PodFacts()
    for raw in pods:
        pod = Reader(f"{owner} pod", raw)
        name = pod.text("metadata", "name") or "?"
        pod = Reader(f"{owner} pod {name}", raw)
        facts.pods += 1
        itype = instance_type_of(pod.mapping("spec", "nodeSelector"))
        if itype:
            facts.instance_types.add(itype)
        start = pod.time("status", "startTime")
        if start is not None and (facts.first_start is None or start < facts.first_start):
            facts.first_start = start
        for c in pod.children("status", "containerStatuses"):
            _read_container(facts, name, c)
    facts.restart_times = (sorted(facts.restart_times)
                           if len(facts.restart_times) == facts.restarts else [])
    facts.logs.sort(key=lambda line: line.time)
    return facts


def _read_container(facts: PodFacts, pod: str, c: Reader) -> None:
    container = c.text("name") or "?"
    count = c.integer("restartCount") or 0
    facts.restarts += count
    for state in ("lastState", "state"):
        done = c.child(state, "terminated")
        finished = done.time("finishedAt")
        if finished is None:
            continue
        if state == "lastState" and count:
            facts.restart_times.append(finished)
        facts.logs.append(LogLine(finished, _termination(pod, container, done, count)))


def _termination(pod: str, container: str, done: Reader, restarts: int) -> str:
    # Worded so the log signatures read it: "OOMKilled", "exit code 137".
    reason = done.text("reason") or "Terminated"
    text = f"pod {pod} container {container} terminated: {reason}"
    code = done.integer("exitCode")
    if code is not None:
        text += f" (exit code {code})"
    if done.text("message"):
        text += f": {done.text('message')}"
    if restarts:
        text += f"; restarted {restarts} time{'s' if restarts != 1 else ''}"
    return text
