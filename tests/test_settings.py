"""One settings contract per runtime (issue 14, item 2): ``Settings.to_env()`` is what
each stack writes, ``Settings.from_env()`` what each runtime reads, one boolean parser
and one ``ConfigError`` for all three.

The synthesised stacks (the session's synth, tests/conftest.py) are parsed back through
``Settings.from_env`` function by function, so a renamed or mistyped setting fails here,
not in a deploy. The schedule's interval reaches the tick: shown end to end on each
runtime with the fixtures of its own tests: the CronJob against the recorded Kubernetes
API (no real API server runs here), the Lambda on moto in server mode with the recorded
SageMaker API, the Function on Azurite with the recorded Azure ML workspace.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import pytest

from tests.contract.case_azureml import NOW as AZURE_NOW
from tests.k8s_configmap import ConfigMapReplay
from tests.test_aws_runtime import (  # noqa: F401 (fixtures)
    inbox,
    make_lambda,
    moto_url,
    oom_logs,
    scheduled,
    table,
)
from tests.test_azure_runtime import (  # noqa: F401 (fixtures)
    BRIGHT,
    Azure,
    azure,
    azurite,
    connection,
    metrics_api,
    replay,
    webhook,
)
from tests.test_k8s_runtime import NOW, NS, cm, fleet, suspended  # noqa: F401 (cm: a fixture)
from trainguard.config import ConfigError, parse_bool
from trainguard.config.settings import aws, k8s
from trainguard.config.settings import azure as azure_settings
from trainguard.stacks.environment import (
    AwsEnvironment,
    AzureEnvironment,
    Environment,
    OpenshiftEnvironment,
    load_environment,
)

ROOT = Path(__file__).resolve().parent.parent
Stack = dict[str, Any]

TRUE = ["true", "True", " yes ", "1", "ON"]
FALSE = ["false", "FALSE", "no", "0", " off"]


# ------------------------------------------------------------------ the one parser


@pytest.mark.parametrize("text", TRUE)
def test_every_true_spelling_is_true(text: str) -> None:
    assert parse_bool("TRAINGUARD_STOP_ENABLED", text) is True


@pytest.mark.parametrize("text", FALSE)
def test_every_false_spelling_is_false(text: str) -> None:
    assert parse_bool("TRAINGUARD_STOP_ENABLED", text) is False


@pytest.mark.parametrize("text", ["ture", "yes please", "2", "enabled", "t"])
def test_anything_else_names_the_variable_and_the_value(text: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_bool("TRAINGUARD_STOP_ENABLED", text)
    assert str(e.value).startswith(f"TRAINGUARD_STOP_ENABLED={text!r}: expected one of")


BASE = {
    "aws": {aws.STATE_TABLE_ENV: "state", aws.REGION_ENV: "eu-west-1"},
    "azure": {"TRAINGUARD_SUBSCRIPTION": "s", "TRAINGUARD_ML_RESOURCE_GROUP": "g",
              "TRAINGUARD_ML_WORKSPACE": "w", "TRAINGUARD_STATE_TABLE_URL": "https://t/x"},
    "k8s": {},
}


class RuntimeSettings(Protocol):
    """What each runtime's settings hold in common."""

    @property
    def stop_enabled(self) -> bool: ...

    def to_env(self) -> dict[str, str]: ...


class SettingsClass(Protocol):
    """What the three ``Settings`` classes have in common, as classes."""

    def from_env(self, env: Mapping[str, str]) -> RuntimeSettings: ...

    def unknown(self, env: Mapping[str, str]) -> set[str]: ...


SETTINGS: dict[str, SettingsClass] = {
    "aws": aws.Settings, "azure": azure_settings.Settings, "k8s": k8s.Settings}


@pytest.mark.parametrize("runtime", sorted(SETTINGS))
@pytest.mark.parametrize(("text", "expected"), [("yes", True), ("off", False), ("", False)])
def test_every_runtime_reads_stop_enabled_the_same_way(runtime: str, text: str,
                                                       expected: bool) -> None:
    env = {**BASE[runtime], "TRAINGUARD_STOP_ENABLED": text}
    assert SETTINGS[runtime].from_env(env).stop_enabled is expected


@pytest.mark.parametrize("runtime", sorted(SETTINGS))
def test_a_mistyped_switch_is_an_error_in_every_runtime_never_a_dry_run(runtime: str) -> None:
    """Before: the Function read "yes" as dry run, the Lambda refused it, the CronJob
    took it; now all three refuse "yse" by name and accept "yes"."""
    env = {**BASE[runtime], "TRAINGUARD_STOP_ENABLED": "yse"}
    with pytest.raises(ConfigError, match=r"TRAINGUARD_STOP_ENABLED='yse': expected one of"):
        SETTINGS[runtime].from_env(env)


@pytest.mark.parametrize("runtime", sorted(SETTINGS))
@pytest.mark.parametrize("value", ["0", "-300", "soon", "inf"])
def test_a_bad_interval_is_named(runtime: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"TRAINGUARD_INTERVAL_S='{value}'"):
        SETTINGS[runtime].from_env({**BASE[runtime], "TRAINGUARD_INTERVAL_S": value})


@pytest.mark.parametrize("runtime", sorted(SETTINGS))
@pytest.mark.parametrize(("typo", "meant"), [
    ("TRAINGUARD_STOPTAG", "TRAINGUARD_STOP_TAG"),  # the tag guard, silently off
    ("TRAINGUARD_STOP_ENABLE", "TRAINGUARD_STOP_ENABLED"),
    ("TRAINGUARD_INTERVAL", "TRAINGUARD_INTERVAL_S"),
])
def test_a_variable_the_runtime_never_reads_is_refused_by_name(runtime: str, typo: str,
                                                                meant: str) -> None:
    """A mistyped setting is refused with the one it looks like, where the runtime reads
    that one; the runtime does not start on half its settings."""
    with pytest.raises(ConfigError) as e:
        SETTINGS[runtime].from_env({**BASE[runtime], typo: "team=a"})
    said = str(e.value)
    assert said.startswith(f"{typo}: not a setting the ")
    reads = set(FULL[runtime].to_env())  # every setting it has, written
    assert (f"(did you mean {meant}?)" in said) is (meant in reads), said


@pytest.mark.parametrize("runtime", sorted(SETTINGS))
def test_another_runtimes_setting_is_refused_and_another_parts_is_let_be(runtime: str) -> None:
    """``TRAINGUARD_STOP_MODE`` is the CronJob's: on the Lambda or the Function it would do
    nothing, so it is refused there. The emitter's and the tests' variables
    (``TRAINGUARD_SINKS``, ``TRAINGUARD_RUNS``) belong to other processes: let be."""
    other = {"aws": "TRAINGUARD_STOP_MODE", "azure": "TRAINGUARD_TOPIC_ARN",
             "k8s": "TRAINGUARD_TOPIC_ARN"}[runtime]
    with pytest.raises(ConfigError, match=f"^{other}: not a setting the "):
        SETTINGS[runtime].from_env({**BASE[runtime], other: "x"})
    let_be = {**BASE[runtime], "TRAINGUARD_SINKS": "prometheus", "TRAINGUARD_RUNS": "/r"}
    assert SETTINGS[runtime].from_env(let_be) == SETTINGS[runtime].from_env(BASE[runtime])


def test_every_trainguard_variable_in_the_code_is_a_runtimes_or_another_parts() -> None:
    """A new ``TRAINGUARD_`` variable must be a runtime's setting or be listed as another
    part's (``NOT_RUNTIME``): else every runtime would refuse an environment holding it."""
    import re

    root = Path(__file__).resolve().parent.parent
    named: set[str] = set()
    for folder in ("checker", "adapters", "config", "lambdas", "stacks", "trainguard"):
        for path in (root / folder).rglob("*.py"):
            named |= set(re.findall(r"\bTRAINGUARD_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    stray = sorted(n for n in named if all(S.unknown({n: ""}) for S in SETTINGS.values()))
    assert stray == []


# ------------------------------------------------------------------- round trips

FULL: dict[str, Any] = {
    "aws": aws.Settings(table="state", region="eu-west-1", topic_arn="arn:aws:sns:x",
                        policy="p.yaml", stop_enabled=True, stop_tag=("k", "v"),
                        environment="dev", sagemaker={"max_attempts": "8"},
                        idempotency_ttl_s=60, interval_s=300.0),
    "azure": azure_settings.Settings(subscription="s", resource_group="g", workspace="w",
                            schedule="0 */5 * * * *", ml_endpoint="https://ml",
                            ml_ca_file="/ca", ml_retries="2", ml_backoff="0.1",
                            policy="policy.yaml", stop_enabled=True, interval_s=300.0,
                            table_url="https://t/x", table_connection="UseDevelopment",
                            table="tg", metrics_resource_id="/subscriptions/x",
                            metrics_region="westeurope", metrics_endpoint="https://m",
                            metrics_ca_file="/mca", webhook_url="https://hook",
                            webhook_min_severity="warning"),
    "k8s": k8s.Settings(environment="e", policy="/p", stop_enabled=True, stop_mode="delete",
                        interval_s=600.0, cluster="c", namespaces="a,b", kinds="pytorchjob",
                        kube_host="https://k", kubeconfig="/kc", kube_retries=2,
                        kube_backoff=0.25, console_url="https://console",
                        state_configmap="ns/cm", state_sqlite="/s.sqlite", audit_keep=10,
                        prometheus_url="https://p", prometheus_mapping="/m.yaml",
                        prometheus_id="{namespace}/{name}", prometheus_token_file="/t",
                        prometheus_ca_file="/ca", prometheus_tenancy=True,
                        alertmanager_url="https://am", alertmanager_token_file="/t2",
                        alertmanager_ca_file="/ca2", alertmanager_retries=5,
                        pushgateway_url="http://pg", remind_every=3600.0),
}


@pytest.mark.parametrize("runtime", sorted(FULL))
def test_every_field_survives_the_trip_through_the_environment(runtime: str) -> None:
    settings = FULL[runtime]
    env = settings.to_env()
    platform = {aws.REGION_ENV: "eu-west-1"} if runtime == "aws" else {}
    assert SETTINGS[runtime].from_env({**env, **platform}) == settings
    assert all(k.startswith("TRAINGUARD_") for k in env), sorted(env)
    assert not SETTINGS[runtime].unknown(env)


def test_the_lambda_region_is_lambdas_own_never_written() -> None:
    """AWS_REGION is reserved: Lambda refuses a function that sets it."""
    assert aws.REGION_ENV not in FULL["aws"].to_env()


def test_the_cronjob_file_and_environment_share_the_parsers(tmp_path: Path) -> None:
    config = tmp_path / "trainguard.yaml"
    config.write_text("stop_enabled: on\ninterval_s: 120\nnamespaces: [a, b]\n")
    got = k8s.Settings.load({"TRAINGUARD_INTERVAL_S": "300"}, str(config))
    assert (got.stop_enabled, got.interval_s, got.namespaces) == (True, 300.0, "a,b")
    config.write_text("stop_enabled: maybe\n")
    with pytest.raises(ConfigError, match=r"trainguard\.yaml: stop_enabled='maybe'"):
        k8s.Settings.load({}, str(config))


def test_settings_need_nothing_beyond_the_standard_library() -> None:
    """The stacks and the runtimes import them; no cloud SDK comes along."""
    code = ("import sys\n"
            "from trainguard.config.settings import aws, azure, k8s\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('boto3', 'botocore', 'azure', 'kubernetes', 'cdktn', 'aws_lambda_powertools'))\n"
            "print(bad)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"


# --------------------------------------------------- the stacks, parsed back


def environment(name: str) -> Environment:
    return load_environment(ROOT / "environments" / f"{name}.yaml")


def function_envs(stacks: dict[str, Stack]) -> dict[str, tuple[Any, dict[str, str]]]:
    """Every function the sample stacks deploy: its Settings class and its environment."""
    out: dict[str, tuple[Any, dict[str, str]]] = {}
    for name, stack in stacks.items():
        res = stack["resource"]
        for key, fn in res.get("aws_lambda_function", {}).items():
            out[f"{name}/{key}"] = (aws.Settings, dict(fn["environment"]["variables"]))
        for key, fn in res.get("azurerm_linux_function_app", {}).items():
            out[f"{name}/{key}"] = (azure_settings.Settings, dict(fn["app_settings"]))
        for key, cron in res.get("kubernetes_cron_job_v1", {}).items():
            for c in cron["spec"]["job_template"]["spec"]["template"]["spec"]["container"]:
                out[f"{name}/{key}/{c['name']}"] = (
                    k8s.Settings, {e["name"]: e["value"] for e in c.get("env", [])})
    return out


def expected(env: Environment) -> dict[str, Any]:
    """What the environment file says each runtime must run with."""
    spec = env.spec
    want: dict[str, Any] = {"stop_enabled": spec.stop_enabled,
                            "interval_s": spec.tick.tick_seconds()}
    if isinstance(spec, AwsEnvironment):
        want |= {"environment": spec.name, "policy": "policy.yaml",
                 "stop_tag": (spec.stop_tag.key, spec.stop_tag_value)}
    elif isinstance(spec, AzureEnvironment):
        want |= {"subscription": spec.subscription, "policy": "policy.yaml",
                 "workspace": spec.ml_workspace.name, "schedule": spec.tick.ncrontab()}
    elif isinstance(spec, OpenshiftEnvironment):
        want |= {"environment": spec.name, "stop_mode": spec.stop_mode,
                 "namespaces": ",".join(spec.watch_namespaces),
                 "remind_every": spec.remind_every_minutes * 60.0}
    return want


def check(cls: Any, variables: dict[str, str], env: Environment) -> list[str]:
    """Why the runtime would not run as the environment file says (empty: it would)."""
    problems = [f"{k}: the runtime never reads it" for k in sorted(cls.unknown(variables))]
    platform = {aws.REGION_ENV: "us-east-1"} if cls is aws.Settings else {}
    try:
        parsed = cls.from_env({**variables, **platform})
    except ConfigError as e:
        return [*problems, f"refused: {e}"]
    for field, value in expected(env).items():
        if getattr(parsed, field) != value:
            problems.append(f"{field}: the runtime reads {getattr(parsed, field)!r}, the "
                            f"environment says {value!r}")
    return problems


def test_every_function_in_every_stack_reads_its_environment_as_written(
        stacks: dict[str, Stack]) -> None:
    functions = function_envs(stacks)
    kinds = {cls for cls, _ in functions.values()}
    assert kinds == {aws.Settings, azure_settings.Settings, k8s.Settings}, functions.keys()
    for where, (cls, variables) in functions.items():
        problems = check(cls, variables, environment(where.split("/")[0]))
        assert not problems, f"{where}:\n" + "\n".join(problems)


@pytest.mark.parametrize("fault", ["rename", "value"])
def test_a_renamed_or_mistyped_setting_in_a_stack_fails_here(
        stacks: dict[str, Stack], fault: str) -> None:
    """The check above, given a synthesised environment with one fault planted."""
    functions = function_envs(stacks)
    for where, (cls, variables) in functions.items():
        planted = dict(variables)
        if fault == "rename":  # e.g. a stack written with a typo in the name
            planted["TRAINGUARD_STOP_ENABLE"] = planted.pop("TRAINGUARD_STOP_ENABLED")
        else:
            planted["TRAINGUARD_STOP_ENABLED"] = "ture"
        problems = check(cls, planted, environment(where.split("/")[0]))
        assert problems, where
        if fault == "rename":
            assert "TRAINGUARD_STOP_ENABLE: the runtime never reads it" in problems
        else:
            assert any("TRAINGUARD_STOP_ENABLED='ture'" in p for p in problems)


# --------------------------------------- the interval reaches the tick (CronJob)

PERSIST_POLICY = """name: persist
safety: {dry_run: false, persist_ticks: 2, max_stops_per_tick: 5}
cost: {prices: {p4d.24xlarge: 32.77}}
budget: {per_job_usd: 100}
rules:
  budget: {actions: {critical: stop}}
"""


@pytest.mark.parametrize(("interval", "stopped_after_retry"), [(None, True), ("300", False)])
def test_the_schedules_interval_keeps_a_retried_tick_from_counting_twice(
        cm: ConfigMapReplay, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, interval: str | None,
        stopped_after_retry: bool) -> None:
    """persist_ticks 2: a tick one minute after the first (a retried pod) is a second
    tick only when the CronJob does not know its schedule; with TRAINGUARD_INTERVAL_S,
    as the stack sets it, the stop waits for the next scheduled tick."""
    from trainguard.lambdas.k8s.cronjob import OK, main

    policy = tmp_path / "policy.yaml"
    policy.write_text(PERSIST_POLICY)
    values = {"KUBE_HOST": cm.host, "NAMESPACES": NS, "KINDS": "pytorchjob",
              "CLUSTER": "lab", "KUBE_RETRIES": "2", "KUBE_BACKOFF": "0",
              "STATE_CONFIGMAP": cm.ref, "POLICY": str(policy), "STOP_ENABLED": "true"}
    if interval is not None:
        values["INTERVAL_S"] = interval
    monkeypatch.delenv("TRAINGUARD_CONFIG", raising=False)
    for k, v in values.items():
        monkeypatch.setenv(f"TRAINGUARD_{k}", v)
    fleet(cm, ["job-0"])
    assert main(["--now", str(NOW)]) == OK
    assert suspended(cm) == []
    assert main(["--now", str(NOW + 60)]) == OK
    assert (suspended(cm) == ["job-0"]) is stopped_after_retry
    if not stopped_after_retry:
        assert main(["--now", str(NOW + 300)]) == OK
        assert suspended(cm) == ["job-0"]



# ------------------------------ ... and on the Lambda (moto) and the Function (Azurite)

AZURE_PERSIST = """
name: stall-stops
safety: {dry_run: false, max_stops_per_tick: 1, persist_ticks: 2, trusted_signals: [metrics]}
rules:
  stall: {actions: {critical: stop}}
"""


@pytest.mark.parametrize(("interval", "stopped_after_retry"), [(None, True), ("600", False)])
def test_the_function_passes_the_interval_to_the_tick(
        azure: Azure, interval: str | None, stopped_after_retry: bool) -> None:  # noqa: F811
    """The Function on Azurite and the recorded Azure ML workspace: its timer retried a
    minute later is not a second tick when TRAINGUARD_INTERVAL_S says ten minutes."""
    azure.configure(AZURE_PERSIST, stop_enabled=True,
                    **({"TRAINGUARD_INTERVAL_S": interval} if interval else {}))
    azure.invoke(AZURE_NOW)
    assert azure.cancels() == []
    azure.invoke(AZURE_NOW + 60)
    assert (azure.cancels() == [BRIGHT]) is stopped_after_retry
    if not stopped_after_retry:
        azure.invoke(AZURE_NOW + 600)
        assert azure.cancels() == [BRIGHT]


@pytest.mark.parametrize(("interval", "stops"), [(None, 1), ("300", 0)])
def test_the_lambda_passes_the_interval_to_the_tick(
        make_lambda: Any, moto_url: str, interval: str | None, stops: int) -> None:  # noqa: F811
    """The Lambda on moto: two scheduled deliveries a moment apart (a retry) count as two
    ticks toward persist_ticks 2 only when the Lambda does not know its schedule."""
    fn = make_lambda(["iv-a"], persist=2,
                     **({"TRAINGUARD_INTERVAL_S": interval} if interval else {}))
    oom_logs(moto_url, ["iv-a"])
    fn.invoke(scheduled())
    assert fn.server.calls["StopTrainingJob"] == 0
    fn.invoke(scheduled())
    assert fn.server.calls["StopTrainingJob"] == stops
