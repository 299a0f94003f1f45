"""What every source adapter does, so that each provider module only says how its
service lists, reads and stops a job.

A subclass sets ``provider`` and ``STATES`` (the provider's status words to
``JobState``) and implements ``list_running``, ``read_job`` and ``stop``. The base
class isolates failures: a job whose payload is malformed, or whose read fails, is
logged, recorded in ``errors`` and skipped, and every other job is still listed.
Providers that batch reads across jobs (SageMaker's GetMetricData) override
``read_jobs``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from trainguard.checker.model import Job, JobState
from trainguard.checker.sessions import set_aside

log = logging.getLogger("trainguard.adapters")


@dataclass(frozen=True)
class JobError:
    """A job the adapter could not read this time, and why."""

    ref: str
    reason: str


class AdapterError(Exception):
    """The whole source failed (listing, credentials): nothing could be read."""


class Adapter(ABC):
    provider: ClassVar[str]
    #: The provider's own status words, mapped; anything else is UNKNOWN with the raw kept.
    STATES: ClassVar[dict[str, JobState]] = {}
    #: False for read-only sources (Prometheus): their ``stop`` raises AdapterError.
    can_stop: ClassVar[bool] = True

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.provider
        self.errors: list[JobError] = []

    def map_state(self, raw: str | None) -> JobState:
        if raw is None:
            return JobState.UNKNOWN
        return self.STATES.get(raw, JobState.UNKNOWN)

    def list_jobs(self, now: float) -> list[Job]:
        """Every running job with its state, resources, metrics and log lines; the points
        a restarted or resumed job logged again replace the ones it logged before
        (``checker.sessions``)."""
        self.errors = []
        return [set_aside(job) for job in self.read_jobs(list(self.list_running()), now)]

    def read_jobs(self, refs: list[str], now: float) -> list[Job]:
        jobs = []
        for ref in refs:
            job = self.get_job(ref, now)
            if job is not None:
                jobs.append(job)
        return jobs

    def get_job(self, ref: str, now: float) -> Job | None:
        """One job, or None (recorded in ``errors``) when it cannot be read."""
        try:
            return set_aside(self.read_job(ref, now))
        except AdapterError:
            raise
        except Exception as e:  # a malformed payload must not blind us to other jobs
            log.error("%s: skipping job %s: %s", self.name, ref, e)
            self.errors.append(JobError(ref, f"{type(e).__name__}: {e}"))
            return None

    @abstractmethod
    def list_running(self) -> Iterable[str]:
        """References (ids or names) of the jobs running now, every page of them."""

    @abstractmethod
    def read_job(self, ref: str, now: float) -> Job:
        """One job in the normalised model; raise on a payload that cannot be read."""

    @abstractmethod
    def stop(self, job: Job, reason: str) -> None:
        """Ask the provider to stop the job (the tick decides whether it may)."""
