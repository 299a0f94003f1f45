"""Load a policy YAML file into ``checker.policy.Policy``, or say exactly what is wrong.

A policy is one YAML mapping; every key is optional and an empty file is the default
policy. The commented default, ``default-policy.yaml`` beside this module, is the
reference for every key and what it means; ``trainguard policy show`` prints what a file
resolves to. The default values themselves are written once, in the dataclasses of
``trainguard/checker/policy.py``: the schema below takes them from there, and a test holds
the YAML file to them.

Every problem is reported as ``FILE:LINE: FIELD.PATH: reason``, all at once, and
loading raises nothing but ``PolicyError``.
"""

from __future__ import annotations

import dataclasses
import typing
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from trainguard.checker.model import Action, Severity
from trainguard.checker.policy import (
    AccountBudget,
    Budget,
    Cost,
    Period,
    Policy,
    RuleConfig,
    Safety,
    Signal,
    Writable,
)
from trainguard.checker.registry import RULES, rule_names
from trainguard.config.problems import (
    PolicyError,
    Problem,
    load_yaml,
    suggest,
    validation_problems,
)
from trainguard.config.yamlfile import Loc, dotted, line_of

# ------------------------------------------------------------------------- schema

SeverityName = Literal["info", "warning", "critical"]
ActionName = Literal["none", "notify", "stop"]
NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]
Threshold = Annotated[float, Field(gt=0, le=10)]

_STRICT = ConfigDict(extra="forbid", strict=True)


def _default(cls: type[Any], name: str, **constraints: Any) -> Any:
    """A pydantic field with the default the checker's dataclass ``cls`` gives ``name``:
    every default is written once, in trainguard/checker/policy.py."""
    f = {x.name: x for x in dataclasses.fields(cls)}[name]
    if f.default_factory is not dataclasses.MISSING:
        return Field(default_factory=f.default_factory, **constraints)
    return Field(default=f.default, **constraints)


class SafetyModel(BaseModel):
    model_config = _STRICT
    dry_run: bool = _default(Safety, "dry_run")
    max_stops_per_tick: int = _default(Safety, "max_stops_per_tick", ge=0)
    protect_tag: str = _default(Safety, "protect_tag", min_length=1)
    persist_ticks: int = _default(Safety, "persist_ticks", ge=1)
    corroborate_with: list[Signal] = _default(Safety, "corroborate_with")
    trusted_signals: list[Writable] = _default(Safety, "trusted_signals")


class CostModel(BaseModel):
    model_config = _STRICT
    region: str | None = _default(Cost, "region")
    prices: dict[str, NonNegative] = _default(Cost, "prices")
    gpu_hour_usd: NonNegative | None = _default(Cost, "gpu_hour_usd")
    default_hourly_usd: NonNegative | None = _default(Cost, "default_hourly_usd")


class AccountModel(BaseModel):
    model_config = _STRICT
    limit_usd: Positive
    period: Period = _default(AccountBudget, "period")
    scope: str = _default(AccountBudget, "scope", min_length=1)


class BudgetModel(BaseModel):
    model_config = _STRICT
    per_job_usd: Positive | None = _default(Budget, "per_job_usd")
    alert_at: list[Threshold] = _default(Budget, "alert_at")
    accounts: list[AccountModel] = []


class RuleModel(BaseModel):
    model_config = _STRICT
    enabled: bool = _default(RuleConfig, "enabled")
    params: dict[str, Any] = {}
    actions: dict[SeverityName, ActionName] = {}  # merged over RuleConfig's actions


class PolicyModel(BaseModel):
    model_config = _STRICT
    name: str = _default(Policy, "name", min_length=1)
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
            problems.append(Problem(filename, line_of(loc, lines), dotted(loc),
                                    "unknown rule" + suggest(str(name), sorted(known))
                                    + f" (known: {', '.join(sorted(known))})"))
            continue
        params = cfg.get("params", {}) if isinstance(cfg, dict) else {}
        if not isinstance(params, dict):
            continue  # the main schema reports it
        model = params_model(known[name])
        try:
            validated = model.model_validate(params)
        except ValidationError as e:
            problems.extend(validation_problems(e, model, (*loc, "params"), filename, lines))
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
    data, lines = load_yaml(text, filename)
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
        problems.extend(validation_problems(e, PolicyModel, (), filename, lines))
    params, rule_problems = _check_rules(data, filename, lines)
    problems.extend(rule_problems)
    safety = data.get("safety")
    inner = safety.get("dry_run") if isinstance(safety, dict) else None
    if isinstance(data.get("dry_run"), bool) and isinstance(inner, bool) \
            and data["dry_run"] != inner:
        problems.append(Problem(filename, line_of(("dry_run",), lines), "dry_run",
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


#: the commented default policy, package data of ``trainguard.config`` (in the wheel, the
#: Lambda and Function zips and the image alike)
DEFAULT_POLICY_FILE = "default-policy.yaml"


def default_policy_text() -> str:
    return resources.files("trainguard.config").joinpath(DEFAULT_POLICY_FILE).read_text(
        encoding="utf-8")


def default_policy() -> Policy:
    """The embedded default: dry-run, notify only, every rule with its own defaults."""
    return load_policy_text(default_policy_text(), f"<trainguard>/config/{DEFAULT_POLICY_FILE}")


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
