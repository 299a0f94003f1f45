"""The YAML policy loader: good files become the expected ``Policy``; every mistake
names the file, line and field; nothing but ``PolicyError`` ever escapes."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from trainguard.checker.model import Action, Finding, Job, Severity
from trainguard.checker.policy import AccountBudget, Policy
from trainguard.checker.registry import RULES
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.config import (
    PolicyError,
    default_policy,
    load_policy,
    load_policy_text,
    policy_to_dict,
)

ROOT = Path(__file__).resolve().parent.parent


class Probe(Rule):
    """A throwaway rule with known parameters, independent of the built-in rules."""

    name = "probe"

    @dataclass
    class Params:
        min_seconds: float = param(300.0, "seconds without progress before it fires")
        window: int = param(10, "points in the trend window")
        tolerate_eval: bool = param(True, "ignore pauses that look like evaluation")
        patterns: tuple[str, ...] = param((), "log lines to look for")

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        return []


@pytest.fixture(autouse=True)
def probe_rule(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(RULES, "probe", Probe)
    yield


def load(text: str, name: str = "team.yaml") -> Policy:
    return load_policy_text(textwrap.dedent(text), name)


def problems(text: str, name: str = "team.yaml") -> list[str]:
    with pytest.raises(PolicyError) as err:
        load(text, name)
    return str(err.value).splitlines()


GOOD = """\
name: research-team
dry_run: true
safety: {max_stops_per_tick: 2, protect_tag: "keep", persist_ticks: 4}
cost: {region: us-west-2, prices: {ml.p4d.24xlarge: 30.0}, gpu_hour_usd: 2.5}
budget:
  per_job_usd: 5000
  alert_at: [0.5, 0.9]
  accounts: [{scope: "*", period: week, limit_usd: 50000}]
metrics: {loss: train_loss}
rules:
  probe: {enabled: false, params: {min_seconds: 120, patterns: [OOM]}, actions: {critical: stop}}
"""


def test_good_file_loads_to_the_expected_policy(tmp_path: Path) -> None:
    path = tmp_path / "team.yaml"
    path.write_text(GOOD)
    policy = load_policy(path)
    assert policy.name == "research-team"
    assert policy.safety.dry_run is True
    assert (policy.safety.max_stops_per_tick, policy.safety.protect_tag,
            policy.safety.persist_ticks) == (2, "keep", 4)
    assert policy.cost.region == "us-west-2"
    assert policy.cost.prices == {"ml.p4d.24xlarge": 30.0}
    assert policy.cost.gpu_hour_usd == 2.5 and policy.cost.default_hourly_usd is None
    assert policy.budget.per_job_usd == 5000
    assert policy.budget.alert_at == [0.5, 0.9]
    assert policy.budget.accounts == [AccountBudget(limit_usd=50000, period="week", scope="*")]
    assert policy.metrics == {"loss": "train_loss"}
    probe = policy.rule("probe")
    assert probe.enabled is False
    # Only the parameters written down: the rule's own defaults fill the rest.
    assert probe.params == {"min_seconds": 120.0, "patterns": ["OOM"]}
    assert Probe(probe.params).params.window == 10
    # Actions given are merged over the defaults.
    assert probe.actions == {Severity.INFO: Action.NONE, Severity.WARNING: Action.NOTIFY,
                             Severity.CRITICAL: Action.STOP}


def test_empty_file_is_the_default_policy() -> None:
    assert load("") == Policy()
    assert load("# only a comment\n") == Policy()
    assert Policy().safety.dry_run is True


def test_stop_under_dry_run_is_valid() -> None:
    policy = load("rules: {probe: {actions: {critical: stop}}}\n")
    assert policy.safety.dry_run is True
    assert policy.rule("probe").actions[Severity.CRITICAL] is Action.STOP


def test_dry_run_shortcut_sets_safety() -> None:
    assert load("dry_run: false\n").safety.dry_run is False
    assert problems("dry_run: false\nsafety: {dry_run: true}\n") == [
        "team.yaml:1: dry_run: contradicts safety.dry_run; set one of them"]


def test_unknown_top_level_key() -> None:
    out = problems("name: x\nsafty: {dry_run: false}\n")
    assert len(out) == 1
    assert out[0].startswith(
        "team.yaml:2: safty: extra fields not permitted; did you mean 'safety'?")


def test_unknown_nested_key_names_its_path() -> None:
    out = problems("budget:\n  accounts:\n    - {limit_usd: 10}\n"
                   "    - {limit_usd: 5, perod: day}\n")
    assert out[0].startswith("team.yaml:4: budget.accounts[1].perod: extra fields not permitted;"
                             " did you mean 'period'?")


def test_misspelt_rule_param_gets_a_suggestion() -> None:
    out = problems("""\
        rules:
          probe:
            enabled: true
            params:
              min_secnds: 600
        """)
    assert out == ["team.yaml:5: rules.probe.params.min_secnds: extra fields not permitted; "
                   "did you mean 'min_seconds'? (known: min_seconds, window, tolerate_eval, "
                   "patterns)"]


def test_unknown_rule_name() -> None:
    out = problems("rules:\n  prob: {}\n")
    assert out[0].startswith("team.yaml:2: rules.prob: unknown rule; did you mean 'probe'?")


@pytest.mark.parametrize(("text", "expected"), [
    ("safety:\n  max_stops_per_tick: two\n",
     "team.yaml:2: safety.max_stops_per_tick: Input should be a valid integer"),
    ("dry_run: 'no'\n", "team.yaml:1: dry_run: Input should be a valid boolean"),
    ("rules:\n  probe:\n    params: {window: '5'}\n",
     "team.yaml:3: rules.probe.params.window: Input should be a valid integer"),
    ("rules:\n  probe:\n    params: [1, 2]\n",
     "team.yaml:3: rules.probe.params: Input should be a valid dictionary"),
    ("metrics: [loss]\n", "team.yaml:1: metrics: Input should be a valid dictionary"),
])
def test_wrong_type(text: str, expected: str) -> None:
    assert problems(text) == [expected]


def test_bad_severity_and_action() -> None:
    out = problems("rules:\n  probe:\n    actions:\n      critcal: stop\n      warning: halt\n")
    assert out == [
        "team.yaml:4: rules.probe.actions.critcal: Input should be 'info', 'warning' or "
        "'critical'; did you mean 'critical'?",
        "team.yaml:5: rules.probe.actions.warning: Input should be 'none', 'notify' or 'stop'",
    ]


@pytest.mark.parametrize(("text", "expected"), [
    ("cost:\n  prices:\n    ml.g5.xlarge: -1.5\n",
     'team.yaml:3: cost.prices["ml.g5.xlarge"]: Input should be greater than or equal to 0'),
    ("cost: {gpu_hour_usd: -2}\n",
     "team.yaml:1: cost.gpu_hour_usd: Input should be greater than or equal to 0"),
    ("budget:\n  alert_at: [0.5, 12]\n",
     "team.yaml:2: budget.alert_at[1]: Input should be less than or equal to 10"),
    ("budget:\n  alert_at: [0]\n",
     "team.yaml:2: budget.alert_at[0]: Input should be greater than 0"),
    ("safety: {persist_ticks: 0}\n",
     "team.yaml:1: safety.persist_ticks: Input should be greater than or equal to 1"),
    ("safety: {max_stops_per_tick: -1}\n",
     "team.yaml:1: safety.max_stops_per_tick: Input should be greater than or equal to 0"),
    ("budget: {accounts: [{limit_usd: 0}]}\n",
     "team.yaml:1: budget.accounts[0].limit_usd: Input should be greater than 0"),
])
def test_numbers_are_range_checked(text: str, expected: str) -> None:
    assert problems(text) == [expected]


def test_missing_required_field_points_at_its_parent() -> None:
    out = problems("budget:\n  accounts:\n    - {period: day}\n")
    assert out == ["team.yaml:3: budget.accounts[0].limit_usd: Field required"]


def test_every_problem_is_reported_at_once_in_line_order() -> None:
    out = problems("cost: {prices: {x: -1}}\nnme: a\nrules: {probe: {params: {window: 1.5}}}\n")
    assert [line.split(":")[1] for line in out] == ["1", "2", "3"]


def test_yaml_syntax_error_has_file_and_line() -> None:
    out = problems("name: x\nrules:\n  probe: {enabled: true\nbudget: {}\n")
    assert len(out) == 1
    assert out[0].startswith("team.yaml:4: YAML syntax error:")
    assert problems("a: b: c\n")[0].startswith("team.yaml:1: YAML syntax error: mapping values")


def test_duplicate_keys_are_errors() -> None:
    assert problems("name: a\nname: b\n") == [
        "team.yaml:2: name: duplicate key (YAML keeps only the last one, which hides the first)"]


def test_top_level_must_be_a_mapping() -> None:
    assert problems("- stall\n- plateau\n") == [
        "team.yaml:1: a policy is a mapping of settings (name:, rules:, ...), not a list"]


def test_unsafe_yaml_is_refused() -> None:
    assert problems("!!python/object/apply:os.system [echo hi]\n")[0].startswith(
        "team.yaml:1: YAML syntax error:")


def test_file_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError) as err:
        load_policy(missing)
    assert str(err.value).startswith(f"{missing}: cannot read the policy file:")


def test_file_that_is_not_text(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(PolicyError, match=r"bin\.yaml: not UTF-8 text"):
        load_policy(path)


NASTY = [
    "~", "42", "'a string'", "[]", "name: ~", "name: ''", "rules: ~", "rules: [stall]",
    "rules: {probe: ~}", "rules: {probe: [1]}", "rules: {probe: {actions: [stop]}}",
    "rules: {1: {}}", "rules: {probe: {params: {min_seconds: .inf}}}", "cost: {prices: [1]}",
    "cost: {prices: {1.5: 2}}", "budget: {accounts: {scope: x}}", "safety: {dry_run: ~}",
    "metrics: {loss: 3}", "{[a]: 1}", "a: &x [*x]", "&a {b: *a}", "? [a, b]\n: c",
    "<<: {name: merged}", "name: !!binary aGk=", "name: 2024-01-01", "\t", "%YAML 9.9\n---\na: 1",
    "--- a\n--- b", "name: x\n...\n--- [1]",
]


@pytest.mark.parametrize("text", NASTY + [GOOD[:n] for n in range(0, len(GOOD), 17)])
def test_loading_raises_nothing_but_policy_error(text: str) -> None:
    try:
        policy = load_policy_text(text, "fuzz.yaml")
    except PolicyError as e:
        assert str(e).startswith("fuzz.yaml")
        assert e.problems
    else:
        assert isinstance(policy, Policy)


def test_policy_to_dict_round_trips() -> None:
    policy = load(GOOD)
    again = load_policy_text(yaml.safe_dump(policy_to_dict(policy)), "shown.yaml")
    assert again == policy


def test_default_policy_is_documented_dry_run_and_notify_only() -> None:
    policy = default_policy()
    assert policy.safety.dry_run is True
    assert all(a is not Action.STOP for cfg in policy.rules.values() for a in cfg.actions.values())
    lines = (ROOT / "config" / "default-policy.yaml").read_text().splitlines()
    for key in ("dry_run", "max_stops_per_tick", "protect_tag", "persist_ticks", "region",
                "prices", "gpu_hour_usd", "default_hourly_usd", "per_job_usd", "alert_at",
                "accounts", "metrics", "rules"):
        i = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f"{key}:"))
        assert "#" in lines[i] or lines[i - 1].startswith("#"), f"{key} is not explained"


@pytest.mark.parametrize("path", sorted((ROOT / "policies").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_policy_loads(path: Path) -> None:
    assert isinstance(load_policy(path), Policy)


def test_example_policies_say_what_they_promise() -> None:
    research = load_policy(ROOT / "policies" / "research-team.yaml")
    assert research.safety.dry_run is True
    assert research.budget.accounts and research.budget.per_job_usd
    assert all(a is not Action.STOP for c in research.rules.values() for a in c.actions.values())

    prod = load_policy(ROOT / "policies" / "production-stops.yaml")
    assert prod.safety.dry_run is False
    assert prod.safety.max_stops_per_tick >= 1 and prod.safety.persist_ticks >= 2
    stoppers = {name for name, c in prod.rules.items() if Action.STOP in c.actions.values()}
    assert stoppers == {"stall", "divergence", "restarts"}
    assert all(c.actions[Severity.CRITICAL] is Action.STOP for n, c in prod.rules.items()
               if n in stoppers)


def test_every_built_in_rule_accepts_its_own_documented_defaults() -> None:
    from trainguard.checker.registry import rule_names

    for name in rule_names():
        rule_cls = RULES[name]
        params = {p: list(d) if isinstance(d, tuple) else d for p, d, _ in rule_cls.describe()}
        text = yaml.safe_dump({"rules": {name: {"params": params}}})
        policy = load_policy_text(text, f"{name}.yaml")
        rule_cls(policy.rule(name).params)  # the rule builds from what the loader kept
