"""An adapter over jobs held in memory: for tests, and the reference the contract
test holds every real adapter to (like httpx's MockTransport)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, ClassVar

from trainguard.adapters.base import Adapter
from trainguard.checker.model import Job, JobState


class MemoryAdapter(Adapter):
    provider = "memory"
    STATES: ClassVar[dict[str, JobState]] = {
        s.value: s for s in JobState if s is not JobState.UNKNOWN}

    def __init__(self, jobs: dict[str, dict[str, Any]] | None = None,
                 name: str | None = None) -> None:
        """``jobs`` maps an id to a payload: ``{"status": ..., "job": Job}``."""
        super().__init__(name)
        self.payloads: dict[str, dict[str, Any]] = dict(jobs or {})
        self.stopped: list[str] = []

    def list_running(self) -> Iterable[str]:
        return [k for k, p in self.payloads.items() if p.get("status") == "RUNNING"]

    def read_job(self, ref: str, now: float) -> Job:
        payload = self.payloads[ref]
        job = payload["job"]
        if not isinstance(job, Job):
            raise TypeError(f"payload of {ref} holds {type(job).__name__}, not a Job")
        raw = str(payload.get("status"))
        return dataclasses.replace(job, id=ref, provider=self.provider, raw_state=raw,
                                   state=self.map_state(raw))

    def stop(self, job: Job, reason: str) -> None:
        self.stopped.append(job.id)
        self.payloads[job.id]["status"] = "STOPPING"
