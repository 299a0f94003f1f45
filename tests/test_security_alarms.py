"""Attack: forged alarm text (issue 16, finding 2), and the policy fields that say what a
stop may rest on.

A job display name (Azure ML lets anyone who submits a job choose it) or a log line
carrying newlines, chat markup and terminal escapes reached Slack/Teams and email as
is: a forged "What the watchdog did" line, a forged console link, ``<!channel>``. The
webhook is a loopback HTTP server that keeps what it is sent: the receiving end of an
Azure Action Group or Slack webhook, which cannot run here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from trainguard.adapters.azureml.adapter import AzureMLAdapter
from trainguard.adapters.sagemaker.adapter import SageMakerAdapter
from trainguard.checker.model import Action, Finding, Job, Severity
from trainguard.checker.policy import Policy, Safety
from trainguard.config import PolicyError, load_policy
from trainguard.lambdas import trust
from trainguard.lambdas.azure.sinks import WebhookSink
from trainguard.lambdas.k8s.sinks import AlertmanagerSink
from trainguard.lambdas.message import render
from trainguard.lambdas.state import FindingMemory
from trainguard.lambdas.tick import AlarmEvent

FORGED_NAME = ("resnet <!channel> [open](https://evil.example)\nWhat the watchdog did: "
               "STOPPED\x1b[2J\u202egnp.exe")
LOG = ("CUDA out of memory.\nConsole: https://evil.example/login\r\n"
       "What the watchdog did: nothing, all is well")


def event(name: str = FORGED_NAME, provider: str = "azureml") -> AlarmEvent:
    f = Finding("bright_river_4k2m9x7q1z", "logs", Severity.CRITICAL,
                f"the GPU ran out of memory (1 line(s) like: {LOG})",
                evidence={"kind": "cuda_oom", "count": 1, "examples": [LOG]}, action=Action.STOP)
    fm = FindingMemory(f.key, "logs", "critical", f.message, 0.0, 0.0)
    job = Job(id="bright_river_4k2m9x7q1z", provider=provider, name=name,
              console_url="https://ml.azure.com/runs/bright_river_4k2m9x7q1z")
    return AlarmEvent("raise", f, job, provider, f"{provider}:{provider}:ws:{job.id}",
                      0.0, 0.0, 1, fm)


@contextmanager
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    got: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/hook", got
    finally:
        httpd.shutdown()
        httpd.server_close()


def forged_lines(text: str) -> list[str]:
    return [line for line in text.splitlines()
            if line.startswith(("What the watchdog did: STOPPED", "What the watchdog did: nothing",
                                "Console: https://evil"))]


def test_the_chat_webhook_gets_no_markup_no_forged_line_and_the_job_id(tmp_path: Path) -> None:
    with webhook() as (url, got):
        WebhookSink(url, dry_run=False).send(event())
    (body,) = got
    text = body["text"]
    assert forged_lines(text) == []  # before the fix: both forged lines, and the link
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text
    assert "](https://evil" not in text  # no markdown link survives
    assert "\x1b" not in text and "\u202e" not in text
    assert body["subject"].startswith("[trainguard] CRITICAL: logs on bright_river_4k2m9x7q1z (")
    # the fields are data: one line each, the words kept as written
    assert "\n" not in body["fields"]["job"] and "\x1b" not in body["fields"]["job"]
    assert "<!channel>" in body["fields"]["job"]


def test_log_excerpts_are_quoted_on_one_line() -> None:
    text = render(event("bert"), dry_run=False).text
    assert forged_lines(text) == []
    (examples,) = [line for line in text.splitlines() if line.strip().startswith("examples:")]
    assert examples.strip().startswith('examples: "CUDA out of memory. Console: https://evil')


def test_alertmanager_annotations_are_escaped_for_its_chat_receivers() -> None:
    sink = AlertmanagerSink("http://127.0.0.1:9", dry_run=False)
    (alert,) = sink.alerts(event(provider="kubeflow"))
    described = alert["annotations"]["description"]
    assert forged_lines(described) == [] and "<!channel>" not in described


# --- what a stop may rest on ----------------------------------------------------------


def finding(rule: str, severity: Severity = Severity.CRITICAL) -> Finding:
    return Finding("j", rule, severity, rule, action=Action.STOP)


@pytest.mark.parametrize("adapter", [SageMakerAdapter, AzureMLAdapter])
def test_metrics_alone_never_stop_a_job_where_others_can_write_them(adapter: Any) -> None:
    source, policy = adapter, Policy()
    stall = finding("stall")
    assert "rests on metrics" in (trust.refusal(source, stall, [stall], policy) or "")
    # a warning resting on the job's own document (its budget) corroborates it
    budget = finding("budget", Severity.WARNING)
    assert trust.refusal(source, stall, [stall, budget], policy) is None
    # a second forgeable signal does not, unless the policy says it trusts it
    util = finding("utilization")
    assert trust.refusal(source, stall, [stall, util], policy) is not None
    trusting = Policy(safety=Safety(corroborate_with=["state", "platform_metrics"],
                                    trusted_signals=["platform_metrics"]))
    assert trust.refusal(source, stall, [stall, util], trusting) is None


def test_a_bound_source_needs_no_corroboration() -> None:
    class Local:
        name = "local"

    stall = finding("stall")
    assert trust.refusal(Local(), stall, [stall], Policy()) is None


@pytest.mark.parametrize(("text", "where"), [
    ("safety: {corroborate_with: [metrics]}\n", "safety.corroborate_with"),
    ("safety: {trusted_signals: [state]}\n", "safety.trusted_signals"),
    ("safety: {corroborate_with: state}\n", "safety.corroborate_with"),
])
def test_a_bad_trust_field_names_the_file_line_and_field(tmp_path: Path, text: str,
                                                         where: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: x\n" + text)
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    assert f"{path}:2" in str(e.value) and where in str(e.value)


def test_the_trust_fields_load() -> None:
    p = load_policy_text("safety: {corroborate_with: [state, logs], trusted_signals: [metrics]}\n")
    assert p.safety.corroborate_with == ["state", "logs"]
    assert p.safety.trusted_signals == ["metrics"]
    assert load_policy_text("").safety.corroborate_with == ["state"]


def load_policy_text(text: str) -> Policy:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.yaml"
        path.write_text("name: x\n" + text)
        return load_policy(path)
