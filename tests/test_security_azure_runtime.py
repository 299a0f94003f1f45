"""Attack on the Azure runtime (issue 16, finding 1): anyone who can log to the
workspace's runs writes a stalled curve into another team's run; the Function, with a
policy that stops critical stalls, used to cancel that job.

The whole runtime as tests/test_azure_runtime.py runs it: the real Function entry point,
Table Storage on Azurite, Azure ML and MLflow as recorded responses replayed over TLS
(the boundary no real server here can stand behind), webhook and metrics receivers on
loopback. The recorded run's metrics are what the forger wrote: MLflow does not say who
logged a metric.
"""

from __future__ import annotations

from tests import test_azure_runtime as rt
from tests.test_azure_runtime import BRIGHT, STALL_STOPS, Azure
from trainguard.lambdas.state import AuditAction

# The Azure runtime tests' fixtures, as they set them up.
azurite, replay, connection, metrics_api, webhook, azure = (
    rt.azurite, rt.replay, rt.connection, rt.metrics_api, rt.webhook, rt.azure)

DEFAULT_TRUST = STALL_STOPS.replace(", trusted_signals: [metrics]", "")


def test_metrics_anyone_can_log_never_cancel_a_job_alone(azure: Azure) -> None:
    assert DEFAULT_TRUST != STALL_STOPS  # the same policy, trusting nothing extra
    azure.configure(DEFAULT_TRUST)
    azure.invoke()
    assert azure.cancels() == []  # before the fix: bright_river cancelled
    refused = [a for a in azure.state().audit_log() if a.job_id == BRIGHT]
    assert [a.action for a in refused] == [AuditAction.SKIP_UNTRUSTED]
    assert "rests on metrics" in refused[0].reason
    # still alarmed, and the message says why nothing was stopped
    by_job = {m["fields"]["job_id"]: m for m in azure.messages()}
    assert "NOT stopped: the finding rests on metrics" in by_job[BRIGHT]["text"]
