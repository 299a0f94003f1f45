"""Azure ML job statuses (``JobStatus`` in azure-ai-ml's REST models) in the model's words.

Choices that are not one-to-one:

- ``Finalizing`` is RUNNING: the job's code has ended but its outputs are still being
  collected on the compute, which is still billed. ``raw_state`` keeps the word.
- ``NotResponding`` is RUNNING with ``raw_state`` "NotResponding": Azure ML sets it when
  the job stopped sending heartbeats to run history, yet the compute is held (and billed)
  until the job times out or is cancelled, and the job may come back to any earlier
  status. It is exactly what the ``stall`` rule is for, so the adapter keeps watching the
  job and adds a log line that marks the last sign of life (see ``mapping.heartbeat_line``).
- ``Paused`` is PENDING: a user paused the job (Azure ML documents it for labeling jobs);
  it makes no progress by choice and holds no training compute, so the progress rules
  must not judge it, but it is not over either and may resume.
- ``Unknown``, and any word this table lacks, is UNKNOWN with the raw value kept.
"""

from __future__ import annotations

from trainguard.checker.model import JobState

P, R = JobState.PENDING, JobState.RUNNING

STATES: dict[str, JobState] = {
    "NotStarted": P, "Starting": P, "Provisioning": P, "Preparing": P, "Queued": P,
    "Paused": P,
    "Running": R, "Finalizing": R, "NotResponding": R,
    "CancelRequested": JobState.STOPPING,
    "Completed": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
    "Canceled": JobState.STOPPED,
    "Unknown": JobState.UNKNOWN,
}

#: The status that means the job's heartbeat was lost.
NOT_RESPONDING = "NotResponding"
