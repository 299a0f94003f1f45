"""The shared work of every rule; a rule implements ``detect`` and nothing else.

A rule's ``Params`` is a dataclass whose fields are its documented parameters with
their defaults (each field's ``metadata["doc"]`` says what it means); the policy
loader validates a policy's ``rules.<name>.params`` against it.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from trainguard.checker.model import Finding, Job, JobState
from trainguard.checker.policy import Policy


def param(default: Any, doc: str) -> Any:
    """A documented rule parameter."""
    if isinstance(default, list | dict | set):
        return dataclasses.field(default_factory=lambda: type(default)(default),
                                 metadata={"doc": doc})
    return dataclasses.field(default=default, metadata={"doc": doc})


@dataclass
class Context:
    """What a rule may look at besides its job."""

    now: float
    policy: Policy
    jobs: list[Job]  # every job of this tick: the budget rule adds up accounts
    memo: dict[str, Any] = dataclasses.field(default_factory=dict)  # per-tick work of rules
    #: A followed rule's own memory of this job from tick to tick (``checker.follow``),
    #: for work it need not redo on the records it has seen; None when judged once.
    state: dict[str, Any] | None = None


class Rule(ABC):
    name: ClassVar[str]
    Params: ClassVar[type[Any]]
    #: States the rule judges. Most rules only judge jobs that are burning money now.
    states: ClassVar[frozenset[JobState]] = frozenset({JobState.RUNNING})

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        self.params = self.Params(**(params or {}))

    def check(self, job: Job, ctx: Context) -> list[Finding]:
        if job.state not in self.states:
            return []
        return self.detect(job, ctx)

    @abstractmethod
    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        """The findings of this rule for one job at ``ctx.now``."""

    @classmethod
    def describe(cls) -> list[tuple[str, Any, str]]:
        """(name, default, doc) for each parameter: for the README and ``trainguard rules``."""
        out = []
        for f in dataclasses.fields(cls.Params):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            out.append((f.name, default, str(f.metadata.get("doc", ""))))
        return out
