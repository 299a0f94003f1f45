"""The config layer (issue 14, item 1): every policy default written once, in
checker/policy.py's dataclasses; ``runtime_policy``, which every runtime and the local
watch use; the default policy shipped with the package."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.checker.policy import Budget, Cost, Policy, RuleConfig, Safety
from trainguard.checker.registry import rule_names
from trainguard.config import (
    DEFAULT_POLICY_FILE,
    PolicyError,
    default_policy,
    default_policy_text,
    load_policy_text,
    policy_to_dict,
    runtime_policy,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILE = ROOT / "config" / DEFAULT_POLICY_FILE
SECTIONS = {"safety": Safety, "cost": Cost, "budget": Budget}


def disagreements(text: str) -> list[str]:
    """Where a commented default policy says otherwise than the dataclasses, or leaves a
    key out (the file promises "a key left out takes the value shown here")."""
    raw: dict[str, Any] = yaml.safe_load(text)
    out = []
    source = policy_to_dict(Policy())
    for section, cls in SECTIONS.items():
        written = raw.get(section) or {}
        for f in dataclasses.fields(cls):
            if f.name not in written:
                out.append(f"{section}.{f.name}: not in the file")
            elif written[f.name] != source[section][f.name]:
                out.append(f"{section}.{f.name}: the file says {written[f.name]!r}, "
                           f"checker/policy.py says {source[section][f.name]!r}")
    if raw.get("name") != Policy().name:
        out.append(f"name: the file says {raw.get('name')!r}")
    actions = policy_to_dict(Policy(rules={"x": RuleConfig()}))["rules"]["x"]
    rules = raw.get("rules") or {}
    for name in rule_names():
        given = rules.get(name)
        if given is None:
            out.append(f"rules.{name}: not in the file")
        elif given != {"enabled": actions["enabled"], "actions": actions["actions"]}:
            out.append(f"rules.{name}: the file says {given}, checker/policy.py says "
                       f"enabled {actions['enabled']}, actions {actions['actions']}")
    return out


def test_the_default_policy_file_says_what_the_dataclasses_say() -> None:
    assert DEFAULT_FILE.read_text() == default_policy_text()  # what the package loads
    assert disagreements(DEFAULT_FILE.read_text()) == []


@pytest.mark.parametrize(("old", "new", "problem"), [
    ("persist_ticks: 3 ", "persist_ticks: 2 ",
     "safety.persist_ticks: the file says 2, checker/policy.py says 3"),
    ("  dry_run: true ", "  dry_run: false ",
     "safety.dry_run: the file says False, checker/policy.py says True"),
    ("  alert_at: [0.5, 0.8, 1.0]", "  alert_at: [0.5, 1.0]",
     "budget.alert_at: the file says [0.5, 1.0], checker/policy.py says [0.5, 0.8, 1.0]"),
    ("  gpu_hour_usd: null", "  #", "cost.gpu_hour_usd: not in the file"),
])
def test_a_default_changed_in_one_place_only_is_caught(old: str, new: str,
                                                       problem: str) -> None:
    text = DEFAULT_FILE.read_text()
    assert old in text
    assert problem in disagreements(text.replace(old, new, 1))


def test_an_empty_policy_takes_the_dataclasses_defaults() -> None:
    """The schema's defaults come from the dataclasses: a file that says nothing is the
    dataclasses' policy, and so is the shipped default (rules aside)."""
    empty = load_policy_text("", "empty.yaml")
    assert empty == Policy()
    shipped = default_policy()
    assert dataclasses.replace(shipped, rules={}) == Policy()
    assert set(shipped.rules) == set(rule_names())


# ------------------------------------------------------------------ runtime_policy

ALLOWS = "name: allows\nsafety: {dry_run: false}\n"


def test_without_a_path_the_runtime_runs_the_default_policy() -> None:
    assert runtime_policy(None, stop_enabled=True) == default_policy()


def test_the_switch_off_runs_an_allowing_policy_in_dry_run_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(ALLOWS)
    heard: list[str] = []
    policy = runtime_policy(path, stop_enabled=False, warn=heard.append,
                            switch="TRAINGUARD_STOP_ENABLED")
    assert policy.safety.dry_run is True and policy.name == "allows"
    assert heard == ["policy 'allows' allows stops but TRAINGUARD_STOP_ENABLED is not true: "
                     "running in dry run"]
    heard.clear()
    assert runtime_policy(path, stop_enabled=True, warn=heard.append).safety.dry_run is False
    assert heard == []  # the switch can make a policy more careful, never less
    dry = tmp_path / "dry.yaml"
    dry.write_text("safety: {dry_run: true}\n")
    assert runtime_policy(dry, stop_enabled=True, warn=heard.append).safety.dry_run is True
    assert heard == []


def test_the_warning_goes_to_the_log_by_default(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(ALLOWS)
    with caplog.at_level(logging.WARNING, logger="trainguard.config"):
        runtime_policy(path, stop_enabled=False)
    assert "TRAINGUARD_STOP_ENABLED is not true: running in dry run" in caplog.text


def test_a_bad_policy_names_its_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: x\nsafety:\n  persist_tick: 2\n")
    with pytest.raises(PolicyError) as e:
        runtime_policy(path, stop_enabled=True)
    assert str(e.value).startswith(f"{path}:3: safety.persist_tick: extra fields not "
                                   "permitted; did you mean 'persist_ticks'?")
    with pytest.raises(PolicyError, match="cannot read the policy file"):
        runtime_policy(tmp_path / "missing.yaml", stop_enabled=True)


def test_every_runtime_loads_its_policy_through_runtime_policy() -> None:
    """Written once: no runtime calls the loader or effective_policy itself."""
    runtimes = [ROOT / "lambdas" / "aws" / "runtime.py",
                ROOT / "lambdas" / "azure" / "function_app.py",
                ROOT / "lambdas" / "k8s" / "cronjob.py"]
    assert "runtime_policy(" in (ROOT / "trainguard" / "common.py").read_text()  # the CLI
    for path in runtimes:
        text = path.read_text()
        assert "runtime_policy(" in text, path
        for other in ("load_policy(", "default_policy(", "effective_policy("):
            calls = [line for line in text.splitlines() if other in line
                     and not line.lstrip().startswith(("def ", "#"))]
            assert not calls, f"{path}: {calls}"


# ------------------------------------------------------------------- shipped


def test_the_zips_carry_the_config_layer_and_the_default_policy() -> None:
    from trainguard.stacks import package

    names = {name for name, _ in package._code_files(ROOT)}
    assert f"trainguard/config/{DEFAULT_POLICY_FILE}" in names
    assert "trainguard/config/policy.py" in names and "trainguard/config/settings/aws.py" in names
    assert not [n for n in names if n.startswith("trainguard/data/") or n == "trainguard/policy.py"]
