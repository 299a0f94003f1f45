"""Load a policy YAML file into ``checker.policy.Policy``, or say exactly what is wrong.

A policy is one YAML mapping; every key is optional and an empty file is the default
policy (dry-run, notify only). The full, commented default is
``trainguard/data/default-policy.yaml``. Fields:

``name``
    A label for the policy (default ``default``).
``dry_run``
    Shortcut for ``safety.dry_run``; giving both with different values is an error.
``safety``
    ``dry_run`` (bool, default true): findings and audit records, never a real stop.
    ``max_stops_per_tick`` (int >= 0, default 1): stops allowed in one tick.
    ``protect_tag`` (non-empty string, default ``trainguard:protect``): jobs carrying
    this tag are never stopped. ``persist_ticks`` (int >= 1, default 3): ticks in a row
    a finding must be seen before its job is stopped. ``corroborate_with`` (list of
    ``state``, ``logs``, ``platform_metrics``, default ``[state]``): on a source where
    other principals can write a job's metrics or logs (SageMaker, Azure ML), a stop
    resting on those needs a finding of the same job, in the same tick, resting on one
    of these signals; otherwise the stop is refused and audited (docs/security.md).
    ``trusted_signals`` (list of ``metrics``, ``logs``, ``platform_metrics``, default
    ``[]``): signals this account has closed to other writers (an SCP or permissions
    boundary, docs/security.md), on which a stop may then rest alone.
``cost``
    ``region`` (string): the price book's region (default: each provider's default).
    ``prices`` (instance type -> $/hour >= 0): wins over the price book.
    ``gpu_hour_usd`` (>= 0): $ per GPU-hour for jobs with no instance price (on-prem).
    ``default_hourly_usd`` (>= 0): $/hour for a job nothing else prices.
``budget``
    ``per_job_usd`` (> 0): a job's spend limit. ``alert_at`` (list of fractions of a
    limit, each in (0, 10], default [0.5, 0.8, 1.0]). ``accounts``: list of
    ``{scope, period, limit_usd}``; ``scope`` is ``*`` (every scope) or a scope string,
    ``period`` is ``day``, ``week`` or ``month``, ``limit_usd`` > 0.
``metrics``
    Aliases from well-known names (``loss``, ``val_loss``, ``step``, ``gpu_util``...)
    to the job's own metric names, e.g. ``loss: train_loss``.
``rules``
    ``<rule name>: {enabled, params, actions}``. ``params`` are the rule's documented
    parameters (``trainguard rules`` lists them); ``actions`` maps a severity
    (``info``, ``warning``, ``critical``) to ``none``, ``notify`` or ``stop``, merged
    over the default ``{info: none, warning: notify, critical: notify}``. A ``stop``
    under dry-run is valid: it audits what would have been stopped.

Every problem is reported as ``FILE:LINE: FIELD.PATH: reason``, all at once, and
loading raises nothing but ``PolicyError``.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from trainguard.checker.model import Action, Severity
from trainguard.checker.policy import (
    AccountBudget,
    Budget,
    Cost,
    Policy,
    RuleConfig,
    Safety,
    Signal,
    Writable,
)
from trainguard.checker.registry import RULES, rule_names

Loc = tuple[str | int, ...]

# ---------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    field: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.field}: {self.reason}" if self.field else f"{where}: {self.reason}"


class PolicyError(Exception):
    """Everything wrong with one policy file, one line per problem."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.line or 0, p.field))
        super().__init__("\n".join(str(p) for p in self.problems))


# ------------------------------------------------------------------ YAML with lines


_PLAIN_TAGS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}


class _LineLoader(yaml.SafeLoader):
    """A safe loader that also records the line of every mapping key and list item, so
    that a validation error at ``rules.stall.params`` can name the line it is on."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.lines: dict[Loc, int] = {}
        self.duplicates: list[tuple[Loc, int]] = []

    def load_with_lines(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        self.lines[()] = node.start_mark.line + 1
        return self._build(node, (), set())

    def _build(self, node: yaml.Node, path: Loc, seen: set[int]) -> Any:
        if id(node) in seen:  # an alias of its own ancestor: a loop, not a policy
            raise yaml.constructor.ConstructorError(
                None, None, "a recursive alias is not allowed here", node.start_mark)
        seen = seen | {id(node)}
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode) and node.tag not in _PLAIN_TAGS:
            raise yaml.constructor.ConstructorError(
                None, None, f"the tag {node.tag} is not allowed in a policy", node.start_mark)
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)  # merge keys (<<: *defaults)
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool):
                    raise yaml.constructor.ConstructorError(
                        None, None, "a mapping key must be a plain value", key_node.start_mark)
                where = (*path, key if isinstance(key, str | int) else str(key))
                if key in out:
                    self.duplicates.append((where, key_node.start_mark.line + 1))
                self.lines[where] = key_node.start_mark.line + 1
                out[key] = self._build(value_node, where, seen)
            return out
        if isinstance(node, yaml.SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                self.lines[(*path, i)] = item.start_mark.line + 1
                items.append(self._build(item, (*path, i), seen))
            return items
        return self.construct_object(node, deep=True)


def _parse(text: str, filename: str) -> tuple[Any, dict[Loc, int]]:
    loader = _LineLoader(text)
    try:
        data = loader.load_with_lines()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        reason = "; ".join(s for s in (e.context, e.problem) if s) or "invalid YAML"
        line = mark.line + 1 if mark is not None else None
        raise PolicyError([Problem(filename, line, "", f"YAML syntax error: {reason}")]) from None
    except yaml.YAMLError as e:
        raise PolicyError([Problem(filename, None, "", f"YAML error: {e}")]) from None
    finally:
        loader.dispose()
    if loader.duplicates:
        raise PolicyError([Problem(filename, line, _dotted(loc), "duplicate key (YAML keeps "
                                   "only the last one, which hides the first)")
                           for loc, line in loader.duplicates])
    return data, loader.lines


# ------------------------------------------------------------------------- schema

SeverityName = Literal["info", "warning", "critical"]
ActionName = Literal["none", "notify", "stop"]
NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]
Threshold = Annotated[float, Field(gt=0, le=10)]

_STRICT = ConfigDict(extra="forbid", strict=True)


class SafetyModel(BaseModel):
    model_config = _STRICT
    dry_run: bool = True
    max_stops_per_tick: int = Field(default=1, ge=0)
    protect_tag: str = Field(default="trainguard:protect", min_length=1)
    persist_ticks: int = Field(default=3, ge=1)
    corroborate_with: list[Signal] = Field(
        default_factory=lambda: list(Safety().corroborate_with))
    trusted_signals: list[Writable] = Field(
        default_factory=lambda: list(Safety().trusted_signals))


class CostModel(BaseModel):
    model_config = _STRICT
    region: str | None = None
    prices: dict[str, NonNegative] = {}
    gpu_hour_usd: NonNegative | None = None
    default_hourly_usd: NonNegative | None = None


class AccountModel(BaseModel):
    model_config = _STRICT
    limit_usd: Positive
    period: Literal["day", "week", "month"] = "month"
    scope: str = Field(default="*", min_length=1)


class BudgetModel(BaseModel):
    model_config = _STRICT
    per_job_usd: Positive | None = None
    alert_at: list[Threshold] = [0.5, 0.8, 1.0]
    accounts: list[AccountModel] = []


class RuleModel(BaseModel):
    model_config = _STRICT
    enabled: bool = True
    params: dict[str, Any] = {}
    actions: dict[SeverityName, ActionName] = {}


class PolicyModel(BaseModel):
    model_config = _STRICT
    name: str = Field(default="default", min_length=1)
    dry_run: bool | None = None
    safety: SafetyModel = Field(default_factory=SafetyModel)
    cost: CostModel = Field(default_factory=CostModel)
    budget: BudgetModel = Field(default_factory=BudgetModel)
    metrics: dict[str, str] = {}
    rules: dict[str, RuleModel] = {}


def _param_type(annotation: Any) -> Any:
    # YAML has lists, never tuples: accept a list where a rule's parameter is a tuple.
    if typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        return list[args[0]] if len(args) == 2 and args[1] is Ellipsis else list[Any]  # type: ignore[valid-type]
    return annotation


def params_model(rule_cls: type[Any]) -> type[BaseModel]:
    """A pydantic model of a rule's ``Params`` dataclass: same names, types and defaults,
    unknown names forbidden."""
    params = rule_cls.Params
    try:
        hints = typing.get_type_hints(params)
    except Exception:  # an annotation this module cannot resolve: check names only
        hints = {}
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(params):
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = Field(default_factory=f.default_factory)
        else:
            default = ...
        fields[f.name] = (_param_type(hints.get(f.name, Any)), default)
    config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)
    model: type[BaseModel] = create_model(
        f"{rule_cls.__name__}Params", __config__=config, **fields)
    return model


# --------------------------------------------------------------------- validation


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "." in part or " " in part:  # an instance type such as ml.p4d.24xlarge
            out += f'["{part}"]'
        else:
            out += f".{part}" if out else part
    return out


def _line_of(loc: Loc, lines: dict[Loc, int]) -> int | None:
    for n in range(len(loc), -1, -1):  # the field itself, else its nearest written parent
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _suggest(word: str, choices: list[str]) -> str:
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


def _problems(err: ValidationError, root: type[BaseModel], prefix: Loc, filename: str,
              lines: dict[Loc, int]) -> list[Problem]:
    out = []
    for e in err.errors(include_url=False):
        loc: Loc = tuple(p for p in e["loc"] if p != "[key]")
        reason = e["msg"]
        if e["type"] == "extra_forbidden":
            owner = _model_at(root, loc[:-1])
            known = list(owner.model_fields) if isinstance(owner, type) and issubclass(
                owner, BaseModel) else []
            reason = "extra fields not permitted" + _suggest(str(loc[-1]), known)
            if known:
                reason += f" (known: {', '.join(known)})"
        elif e["type"] == "literal_error" and isinstance(e.get("input"), str):
            choices = [str(c) for c in (e.get("ctx") or {}).get("expected", "").replace(
                "'", "").replace(" or ", ", ").split(", ") if c]
            reason += _suggest(e["input"], choices)
        full = (*prefix, *loc)
        out.append(Problem(filename, _line_of(full, lines), _dotted(full), reason))
    return out


def _known_rules() -> dict[str, type[Any]]:
    rule_names()  # imports the built-in rules so that they register
    return dict(RULES)


def _check_rules(data: dict[Any, Any], filename: str, lines: dict[Loc, int]
                 ) -> tuple[dict[str, dict[str, Any]], list[Problem]]:
    """Validate each rule's name and params against that rule's ``Params``."""
    known = _known_rules()
    params_out: dict[str, dict[str, Any]] = {}
    problems: list[Problem] = []
    rules = data.get("rules")
    if not isinstance(rules, dict):
        return params_out, problems
    for name, cfg in rules.items():
        loc: Loc = ("rules", name)
        if name not in known:
            problems.append(Problem(filename, _line_of(loc, lines), _dotted(loc),
                                    "unknown rule" + _suggest(str(name), sorted(known))
                                    + f" (known: {', '.join(sorted(known))})"))
            continue
        params = cfg.get("params", {}) if isinstance(cfg, dict) else {}
        if not isinstance(params, dict):
            continue  # the main schema reports it
        model = params_model(known[name])
        try:
            validated = model.model_validate(params)
        except ValidationError as e:
            problems.extend(_problems(e, model, (*loc, "params"), filename, lines))
            continue
        params_out[name] = validated.model_dump(exclude_unset=True)
    return params_out, problems


def _to_policy(m: PolicyModel, params: dict[str, dict[str, Any]]) -> Policy:
    safety = Safety(**m.safety.model_dump())
    if m.dry_run is not None:
        safety.dry_run = m.dry_run
    rules = {}
    for name, r in m.rules.items():
        actions = dict(RuleConfig().actions)
        actions.update({Severity(s): Action(a) for s, a in r.actions.items()})
        rules[name] = RuleConfig(enabled=r.enabled, params=params.get(name, {}), actions=actions)
    return Policy(
        name=m.name, rules=rules, safety=safety, metrics=dict(m.metrics),
        cost=Cost(**m.cost.model_dump()),
        budget=Budget(per_job_usd=m.budget.per_job_usd, alert_at=list(m.budget.alert_at),
                      accounts=[AccountBudget(**a.model_dump()) for a in m.budget.accounts]),
    )


def load_policy_text(text: str, filename: str = "<policy>") -> Policy:
    data, lines = _parse(text, filename)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError([Problem(filename, lines.get(()), "", "a policy is a mapping of "
                                   f"settings (name:, rules:, ...), not a {type(data).__name__}")])
    problems: list[Problem] = []
    model: PolicyModel | None = None
    try:
        model = PolicyModel.model_validate(data)
    except ValidationError as e:
        problems.extend(_problems(e, PolicyModel, (), filename, lines))
    params, rule_problems = _check_rules(data, filename, lines)
    problems.extend(rule_problems)
    safety = data.get("safety")
    inner = safety.get("dry_run") if isinstance(safety, dict) else None
    if isinstance(data.get("dry_run"), bool) and isinstance(inner, bool) \
            and data["dry_run"] != inner:
        problems.append(Problem(filename, _line_of(("dry_run",), lines), "dry_run",
                                "contradicts safety.dry_run; set one of them"))
    if problems or model is None:
        raise PolicyError(problems)
    return _to_policy(model, params)


def load_policy(path: str | Path) -> Policy:
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError([Problem(name, None, "", f"cannot read the policy file: "
                                   f"{e.strerror or e}")]) from None
    except UnicodeDecodeError as e:
        raise PolicyError([Problem(name, None, "", f"not UTF-8 text: {e.reason}")]) from None
    return load_policy_text(text, name)


DEFAULT_POLICY_FILE = "default-policy.yaml"


def default_policy_text() -> str:
    return resources.files("trainguard").joinpath("data", DEFAULT_POLICY_FILE).read_text(
        encoding="utf-8")


def default_policy() -> Policy:
    """The embedded default: dry-run, notify only, every rule with its own defaults."""
    return load_policy_text(default_policy_text(), f"<trainguard>/data/{DEFAULT_POLICY_FILE}")


# ------------------------------------------------------------------------- output


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k.value if isinstance(k, Severity | Action) else k): _plain(v)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Severity | Action):
        return value.value
    return value


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The policy as plain YAML-ready data (for ``trainguard policy show``); it loads back
    to an equal ``Policy`` with ``load_policy_text``."""
    return {
        "name": policy.name,
        "safety": _plain(dataclasses.asdict(policy.safety)),
        "cost": _plain(dataclasses.asdict(policy.cost)),
        "budget": _plain(dataclasses.asdict(policy.budget)),
        "metrics": dict(policy.metrics),
        "rules": {name: {"enabled": cfg.enabled, "params": _plain(cfg.params),
                         "actions": _plain(cfg.actions)}
                  for name, cfg in policy.rules.items()},
    }
