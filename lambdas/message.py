"""The alarm message a person reads, built once for every runtime (SNS email, Azure webhook,
Alertmanager annotations, the local console): which job, what is wrong, the evidence, the
money burnt so far and projected, the console link, and what the watchdog did about it.

``render(event, dry_run)`` returns a ``Message``: a one-line ``subject`` (ASCII, at most 100
characters: SNS's limit for email subjects), the plain ``text`` body, and ``fields``, the
same facts as flat strings for systems that want labels (Alertmanager, Azure dimensions).

Much of what a message says was written by someone other than the watchdog: job names,
states, scopes, finding messages that quote a job's log lines. Every such field is made
one line of printable text (``clean``: no newline, control or bidi character can forge
a "What the watchdog did" or "Console" line), log excerpts are quoted, the subject names
the job by its platform id, and ``chat_text`` escapes the result for Slack, Teams and
HTML, where ``<url|text>``, ``<!channel>`` or ``[text](url)`` would otherwise be markup.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainguard.checker.model import Action
from trainguard.lambdas.state import AuditAction
from trainguard.lambdas.tick import AlarmEvent

SUBJECT_MAX = 100  # SNS rejects longer email subjects
FIELD_MAX = 500  # characters kept of one untrusted field

# Bidi overrides and isolates reorder what a reader sees; line separators break lines.
_INVISIBLE = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                       "\u2066\u2067\u2068\u2069\u2028\u2029\ufeff")


def clean(text: Any, limit: int = FIELD_MAX) -> str:
    """``text`` as one line of printable characters: control characters (newlines and
    terminal escapes included), bidi controls and line separators become spaces."""
    out = "".join(" " if c in _INVISIBLE or unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")
                  else c for c in str(text))
    out = re.sub(r" {2,}", " ", out).strip()
    return out if len(out) <= limit else out[:limit - 3] + "..."


def quote(text: Any) -> str:
    """An untrusted excerpt (a log line) in double quotes, its own quotes escaped."""
    return '"' + clean(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


_CHAT = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def chat_text(text: str) -> str:
    """``text`` for Slack, Teams or HTML: ``& < >`` as entities (Slack's own escaping; no
    ``<!channel>``, ``<url|label>`` or tag survives), and no markdown link: ``](`` gets
    a space, which ends a ``[label](url)`` for Teams and CommonMark alike."""
    return "".join(_CHAT.get(c, c) for c in text).replace("](", "] (")


@dataclass(frozen=True)
class Message:
    subject: str
    text: str
    fields: dict[str, str] = field(default_factory=dict)


def _skip_protected(_: str) -> str:
    return ("NOT stopped: the job is protected (it carries the policy's safety.protect_tag, "
            "or lacks the opt-in tag the deployment requires before a stop).")


def _skip_cap(_: str) -> str:
    return ("NOT stopped this tick: the cap on stops per tick (safety.max_stops_per_tick) "
            "was reached by more urgent or more expensive jobs; it will be considered again "
            "next tick.")


def _skip_persistence(detail: str) -> str:
    seen = f"{detail} tick(s) in a row" if detail.isdigit() else "too few ticks"
    return (f"NOT stopped yet: the finding asking for a stop has been seen {seen}; the "
            f"policy needs it to persist longer first (safety.persist_ticks).")


def _skip_intent(_: str) -> str:
    return "A stop was already recorded for this job earlier; the watchdog never stops twice."


def _skip_stopping(_: str) -> str:
    return "Nothing to do: the job is already stopping or has ended."


def _skip_untrusted(_: str) -> str:
    return ("NOT stopped: the finding rests on metrics or log lines that principals other "
            "than the job can write here, and nothing the platform itself reports "
            "corroborates it (safety.corroborate_with; docs/security.md).")


def _stop_failed(_: str) -> str:
    return ("The watchdog TRIED to stop the job and the stop call FAILED; it tries again on "
            "the next ticks and raises a critical stop_failed alarm if it gives up. Check "
            "the watchdog's permissions, or stop the job by hand.")


PENDING_TICK = "pending_tick"  # an alarm raised between ticks (a log line): the tick decides


def _pending_tick(_: str) -> str:
    return ("Not stopped yet: the watchdog's next scheduled tick decides, under the "
            "policy's safety rules (dry run, persistence, cap, protect tag).")


# The tick audits its last decision per finding as "<action><detail>" (see tick._audit).
_DECISIONS: dict[str, Callable[[str], str]] = {
    AuditAction.SKIP_PROTECTED.value: _skip_protected,
    AuditAction.SKIP_CAP.value: _skip_cap,
    AuditAction.SKIP_PERSISTENCE.value: _skip_persistence,
    AuditAction.SKIP_INTENT.value: _skip_intent,
    AuditAction.SKIP_STOPPING.value: _skip_stopping,
    "skip_untrusted": _skip_untrusted,  # AuditAction.SKIP_UNTRUSTED (lambdas/trust.py)
    AuditAction.STOP_FAILED.value: _stop_failed,
    PENDING_TICK: _pending_tick,
}


def action_taken(event: AlarmEvent, dry_run: bool) -> str:
    """What the watchdog did about this finding, in one sentence."""
    if event.kind == "resolve":
        return "Nothing: the finding has cleared."
    f = event.finding
    if f is None or f.action != Action.STOP:
        return "Notified only: the policy does not ask to stop a job for this finding."
    if event.stopped:
        if dry_run:
            return ("WOULD HAVE STOPPED the job, but the policy is in dry run "
                    "(safety.dry_run: true); nothing was stopped.")
        return "STOPPED the job (the stop is recorded in the audit log)."
    decision = event.memory.last_decision or ""
    for prefix in sorted(_DECISIONS, key=len, reverse=True):  # longest first: unambiguous
        if decision.startswith(prefix):
            return _DECISIONS[prefix](decision[len(prefix):])
    return "Not stopped this tick."


def _usd(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "unknown"
    return f"${value:,.2f}"


def _value(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        # whole numbers (steps, seconds) in full; others to four significant digits
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
    if isinstance(v, list | tuple):
        return "; ".join(_value(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{clean(k, 60)}={_value(x)}" for k, x in v.items())
    if isinstance(v, str):
        return quote(v)  # evidence text is a job's own words (log lines): quoted
    return clean(v)


def _ascii(text: str) -> str:
    return "".join(c if 32 <= ord(c) < 127 else "?" for c in text)


def _subject(event: AlarmEvent, job_id: str, job_name: str) -> str:
    m = event.memory
    head = {"raise": m.severity.upper(), "remind": f"REMINDER {m.severity}",
            "resolve": "RESOLVED"}[event.kind]
    # The platform's id first: a display name is anyone's to choose, the id is not.
    named = job_id if job_name == job_id else f"{job_id} ({job_name})"
    subject = _ascii(f"[trainguard] {head}: {clean(m.rule)} on {named}")
    if len(subject) > SUBJECT_MAX:
        subject = subject[:SUBJECT_MAX - 3] + "..."
    return subject


def render(event: AlarmEvent, dry_run: bool) -> Message:
    """The message for one alarm event. ``dry_run`` is the policy's ``safety.dry_run``."""
    m, f, job = event.memory, event.finding, event.job
    job_id = clean(job.id if job is not None else event.job_key.rsplit(":", 1)[-1])
    job_name = clean(job.name or job.id) if job is not None else job_id
    did = action_taken(event, dry_run)
    fields: dict[str, str] = {
        "kind": event.kind, "job": job_name, "job_id": job_id, "job_key": clean(event.job_key),
        "source": clean(event.source), "rule": clean(m.rule), "severity": clean(m.severity),
        "what": clean(f.message if f is not None else m.message),
        "ticks": str(event.ticks), "action": did, "dry_run": str(dry_run).lower(),
    }
    lines: list[str] = []
    if event.kind == "resolve":
        lines.append(f"CLEARED: {fields['rule']} on {job_name} no longer fires "
                     f"(it was {fields['severity']}: {clean(m.message)}).")
    else:
        label = "Reminder, still" if event.kind == "remind" else "New"
        lines.append(f"{label} {fields['severity'].upper()} finding on training job "
                     f"{job_name}.")
        lines.append("")
        lines.append(f"What is wrong ({fields['rule']}): {fields['what']}")
    lines.append("")
    lines.append(f"Job:        {job_name}" + (f" ({job_id})" if job_name != job_id else ""))
    if job is not None:
        fields.update(provider=clean(job.provider), scope=clean(job.scope),
                      state=job.state.value)
        lines.append(f"Where:      {fields['provider']} {fields['scope']}")
        state = job.state.value + (f" ({clean(job.raw_state)})" if job.raw_state else "")
        lines.append(f"State:      {state}")
        if job.instance_type:
            fields["instance"] = clean(f"{job.instance_count} x {job.instance_type}")
            lines.append(f"Instances:  {fields['instance']}")
        if job.console_url and _web_link(job.console_url):
            fields["console_url"] = clean(job.console_url)
    lines.append(f"Seen:       {event.ticks} tick(s) in a row")
    if f is not None:
        fields.update(burnt_usd=_usd(f.burnt_usd), projected_usd=_usd(f.projected_usd))
        lines.append(f"Money:      {fields['burnt_usd']} burnt since this started; "
                     f"{fields['projected_usd']} projected by the job's planned end")
        evidence = {k: v for k, v in f.evidence.items() if k != "kind"}
        if f.step is not None:
            evidence = {"step": f.step, **evidence}
        if evidence:
            lines.append("")
            lines.append("Evidence:")
            lines.extend(f"  {k}: {_value(v)}" for k, v in evidence.items())
            fields["evidence"] = _value(evidence)
    lines.append("")
    lines.append(f"What the watchdog did: {did}")
    if "console_url" in fields:
        lines.append("")
        lines.append(f"Console: {fields['console_url']}")
    return Message(_subject(event, job_id, job_name), "\n".join(lines) + "\n", fields)


def _web_link(url: str) -> bool:
    # A console link is offered only as an https (or http) URL with no space or control.
    return re.fullmatch(r"https?://[^\s\x00-\x1f\x7f]+", url) is not None
