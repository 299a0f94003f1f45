"""Failure signatures in training logs: one list, used by the ``logs`` rule here and
exported to CloudWatch filter patterns, KQL and LogQL so the forms cannot drift apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainguard.checker.model import Severity


@dataclass(frozen=True)
class Signature:
    name: str
    pattern: str  # a Python regex, case-insensitive
    severity: Severity
    meaning: str
    literals: tuple[str, ...]  # plain substrings for log systems without regex (CloudWatch)

    @property
    def regex(self) -> re.Pattern[str]:
        return _compiled(self.pattern)


_CACHE: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    if pattern not in _CACHE:
        _CACHE[pattern] = re.compile(pattern, re.IGNORECASE)
    return _CACHE[pattern]


C, W = Severity.CRITICAL, Severity.WARNING
SIGNATURES: tuple[Signature, ...] = (
    Signature("cuda_oom", r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED",
              C, "the GPU ran out of memory", ("CUDA out of memory", "OutOfMemoryError")),
    Signature("nccl_timeout",
              r"Watchdog caught collective operation timeout|NCCL.{0,80}time(d)? ?out"
              r"|ProcessGroupNCCL.{0,80}Timeout",
              C, "a collective operation timed out: a rank is hung or gone",
              ("Watchdog caught collective operation timeout", "NCCL timeout")),
    Signature("dataloader_killed",
              r"DataLoader worker \(pid\(?s?\)?.{0,40}\) (is killed|exited unexpectedly)",
              C, "a data loading worker died (often host memory)",
              ("DataLoader worker",)),
    Signature("gpu_xid", r"NVRM: Xid|\bXid[ :(]+\d+", C,
              "the GPU driver reported an Xid error: hardware or driver fault", ("Xid",)),
    Signature("ecc_error", r"uncorrectable ECC|ECC error|DBE \(double bit error\)", C,
              "GPU memory ECC error: the device needs draining", ("ECC error",)),
    Signature("oom_killed", r"OOMKilled|exit(ed)? (with )?(code|status)[ :=]*137"
              r"|Killed process \d+|signal 9 \(SIGKILL\)", C,
              "the kernel killed the process for memory (exit 137)",
              ("OOMKilled", "exit code 137")),
    Signature("nan_loss", r"loss (is |=|:)?\s*nan\b|nan loss|loss became (nan|inf)"
              r"|non-finite loss|Detected (inf|nan)", W,
              "the training loop reported a NaN or infinite loss", ("NaN loss", "loss is nan")),
    Signature("traceback", r"^Traceback \(most recent call last\)", W,
              "a Python exception was raised", ("Traceback (most recent call last)",)),
)
BY_NAME = {s.name: s for s in SIGNATURES}


def match(line: str) -> Signature | None:
    """The first signature a log line matches, most severe first (the list is ordered)."""
    for sig in SIGNATURES:
        if sig.regex.search(line):
            return sig
    return None
