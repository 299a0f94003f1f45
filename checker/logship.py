"""The log failure signatures (``checker.signatures.SIGNATURES``) in the form each
platform's log pipeline wants, generated from the one list so they cannot drift apart:
a CloudWatch Logs filter pattern, KQL for Azure Monitor scheduled query alerts, LogQL
for the LokiStack ruler and rewrite_tag rules for Fluent Bit."""

from __future__ import annotations

from trainguard.checker.model import Severity
from trainguard.checker.signatures import SIGNATURES, Signature

CLOUDWATCH_PATTERN_LIMIT = 1024  # characters, the service's limit for a filter pattern


def cloudwatch_pattern(signatures: tuple[Signature, ...] = SIGNATURES) -> str:
    """Terms ORed with ``?``: CloudWatch filter terms are plain, case-sensitive
    substrings, so each signature contributes its ``literals``."""
    terms = []
    for sig in signatures:
        for lit in sig.literals:
            if '"' in lit:
                raise ValueError(f"signature {sig.name}: a literal cannot hold a double quote")
            terms.append(f'?"{lit}"')
    pattern = " ".join(dict.fromkeys(terms))
    if len(pattern) > CLOUDWATCH_PATTERN_LIMIT:
        raise ValueError(f"the CloudWatch filter pattern is {len(pattern)} characters, "
                         f"over the limit of {CLOUDWATCH_PATTERN_LIMIT}")
    return pattern


def _kql_string(regex: str) -> str:
    if '"' in regex:
        raise ValueError(f"a signature regex cannot hold a double quote: {regex}")
    return f'@"(?i){regex}"'  # verbatim string: backslashes stay as written (RE2 syntax)


def kql_query(table: str, column: str, severity: Severity,
              signatures: tuple[Signature, ...] = SIGNATURES) -> str:
    """Lines of ``severity``'s signatures, counted per signature (the alert's dimension)."""
    sigs = [s for s in signatures if s.severity is severity]
    if not sigs:
        raise ValueError(f"no signature of severity {severity.value}")
    cases = ",\n    ".join(f'{column} matches regex {_kql_string(s.pattern)}, "{s.name}"'
                           for s in sigs)
    return (f"{table}\n"
            f"| extend signature = case(\n    {cases},\n    \"\")\n"
            f"| where signature != \"\"\n"
            f"| summarize lines = count() by signature")


def logql_rule(sig: Signature, selector: str, window: str = "5m") -> str:
    """A LogQL alert expression: lines matching ``sig`` per namespace and pod."""
    regex = sig.pattern.replace("\\", "\\\\")
    return (f"sum by (kubernetes_namespace_name, kubernetes_pod_name) "
            f"(count_over_time({selector} |~ \"(?i){regex}\" [{window}])) > 0")


def fluentbit_rewrite_rules(key: str = "$message",
                            signatures: tuple[Signature, ...] = SIGNATURES) -> list[str]:
    """``Rule`` lines of a rewrite_tag filter: a matching line is copied under the tag
    ``trainguard.<severity>.<signature>`` (the original is kept). Fluent Bit splits a rule
    on spaces, so the regex spells a space as ``\\s``."""
    return [f"{key} (?i){s.pattern.replace(' ', chr(92) + 's')} "
            f"trainguard.{s.severity.value}.{s.name} true" for s in signatures]
