"""What is wrong with a configuration file, said the same way everywhere: one
``Problem`` per fault (``FILE:LINE: FIELD.PATH: reason``), all of a file's problems at
once in one ``PolicyError``, and ``ConfigError`` for a bad setting of a runtime.

``validation_problems`` turns a pydantic ``ValidationError`` into problems with the line
each field is on (``trainguard.config.yamlfile`` records them) and a did-you-mean for a
misspelt key or value.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from trainguard.config.yamlfile import (
    DuplicateKeys,
    Loc,
    YamlSyntaxError,
    dotted,
    line_of,
    parse_yaml,
)


class ConfigError(ValueError):
    """A setting that cannot be used (a missing or bad environment variable, app setting
    or option); the message names the setting and the value."""


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    field: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.field}: {self.reason}" if self.field else f"{where}: {self.reason}"


class PolicyError(ConfigError):
    """Everything wrong with one configuration file (a policy, an environment), one line
    per problem."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.line or 0, p.field))
        super().__init__("\n".join(str(p) for p in self.problems))


def suggest(word: str, choices: list[str]) -> str:
    """``; did you mean 'X'?`` for the closest of ``choices``, or nothing."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _model_at(model: Any, loc: Loc) -> Any:
    """The pydantic model that validates the mapping at ``loc`` (for did-you-mean)."""
    for part in loc:
        if isinstance(model, type) and issubclass(model, BaseModel):
            if not isinstance(part, str) or part not in model.model_fields:
                return None
            model = model.model_fields[part].annotation
        else:
            args = [a for a in typing.get_args(model) if a is not type(None)]
            if typing.get_origin(model) in (list, dict):
                model = args[-1]
            elif len(args) == 1:  # X | None
                model = _model_at(args[0], (part,))
            else:
                return None
    return model


def validation_problems(err: ValidationError, root: type[BaseModel], prefix: Loc,
                        filename: str, lines: dict[Loc, int]) -> list[Problem]:
    """One problem per error of ``err``, raised validating ``root`` at ``prefix``."""
    out = []
    for e in err.errors(include_url=False):
        loc: Loc = tuple(p for p in e["loc"] if p != "[key]")
        reason = e["msg"]
        if e["type"] == "extra_forbidden":
            owner = _model_at(root, loc[:-1])
            known = list(owner.model_fields) if isinstance(owner, type) and issubclass(
                owner, BaseModel) else []
            reason = "extra fields not permitted" + suggest(str(loc[-1]), known)
            if known:
                reason += f" (known: {', '.join(known)})"
        elif e["type"] == "literal_error" and isinstance(e.get("input"), str):
            choices = [str(c) for c in (e.get("ctx") or {}).get("expected", "").replace(
                "'", "").replace(" or ", ", ").split(", ") if c]
            reason += suggest(e["input"], choices)
        full = (*prefix, *loc)
        out.append(Problem(filename, line_of(full, lines), dotted(full), reason))
    return out


def load_yaml(text: str, filename: str) -> tuple[Any, dict[Loc, int]]:
    """``parse_yaml`` with its faults as a ``PolicyError`` naming ``filename``."""
    try:
        return parse_yaml(text)
    except YamlSyntaxError as e:
        raise PolicyError([Problem(filename, e.line, "", e.reason)]) from None
    except DuplicateKeys as e:
        raise PolicyError([Problem(filename, line, dotted(loc), "duplicate key (YAML keeps "
                                   "only the last one, which hides the first)")
                           for loc, line in e.duplicates]) from None
