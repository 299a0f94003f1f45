"""The Lambda's route registry and settings, without AWS: which route an event reaches,
and the error a bad environment variable gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainguard.lambdas.aws import settings as s
from trainguard.lambdas.aws.routes import find, logs, schedule, state_change
from trainguard.lambdas.aws.routes.base import Route, register

ENV = {s.STATE_TABLE_ENV: "state", s.REGION_ENV: "eu-west-1"}


@pytest.mark.parametrize(("event", "route"), [
    ({"detail-type": "Scheduled Event", "id": "e1"}, schedule.Schedule),
    ({"detail-type": "SageMaker Training Job State Change", "id": "e2"},
     state_change.StateChange),
    ({"awslogs": {"data": "x"}}, logs.Logs),
    # an EventBridge detail-type wins over a logs payload, as it always did
    ({"detail-type": "Scheduled Event", "awslogs": {"data": "x"}}, schedule.Schedule),
    ({"detail-type": "Something Else", "awslogs": {"data": "x"}}, logs.Logs),
    ({"detail-type": ["Scheduled Event"], "awslogs": {"data": "x"}}, logs.Logs),
])
def test_an_event_reaches_the_route_of_its_shape(event: dict[str, Any],
                                                 route: type[Route]) -> None:
    found = find(event)
    assert type(found) is route


@pytest.mark.parametrize("event", [
    {"detail-type": "Something Else"}, {"awslogs": "not an object"}, "text", None, [1]])
def test_an_event_of_no_known_shape_has_no_route(event: Any) -> None:
    assert find(event) is None


def test_a_shape_cannot_be_routed_twice() -> None:
    with pytest.raises(ValueError, match="'awslogs' is already routed to Logs"):
        @register(key="awslogs")
        class Again(logs.Logs):
            pass
    with pytest.raises(ValueError, match="by detail_type or by key"):
        register(detail_type="X", key="y")


def test_settings_read_every_variable() -> None:
    got = s.Settings.from_env({
        **ENV, s.TOPIC_ARN_ENV: "arn:topic", s.POLICY_ENV: "/etc/p.yaml",
        s.STOP_ENABLED_ENV: "True", s.STOP_TAG_ENV: " trainguard:stop = allow ",
        s.ENVIRONMENT_ENV: "dev", s.IDEMPOTENCY_TTL_ENV: "60",
        f"{s.SAGEMAKER_ENV_PREFIX}MAX_ATTEMPTS": "8"})
    assert got == s.Settings(
        table="state", topic_arn="arn:topic", region="eu-west-1",
        policy="/etc/p.yaml", stop_enabled=True,
        stop_tag=("trainguard:stop", "allow"), environment="dev",
        sagemaker={"max_attempts": "8"}, idempotency_ttl_s=60)
    assert s.policy_path(got) == Path("/etc/p.yaml")
    default = s.Settings.from_env(ENV)
    assert s.policy_path(default) == s.PACKAGE_ROOT / "policy.yaml"
    assert (default.topic_arn, default.stop_enabled, default.stop_tag) == (None, False, None)


@pytest.mark.parametrize(("env", "message"), [
    ({s.REGION_ENV: "eu-west-1"}, "TRAINGUARD_STATE_TABLE is not set"),
    ({s.STATE_TABLE_ENV: "state"}, "AWS_REGION is not set"),
    ({**ENV, s.STOP_ENABLED_ENV: "yess"}, "TRAINGUARD_STOP_ENABLED='yess': expected one of"),
    # the stop tag is checked before the TTL: the first bad variable is the one named
    ({**ENV, s.STOP_TAG_ENV: "=x", s.IDEMPOTENCY_TTL_ENV: "0"},
     "TRAINGUARD_STOP_TAG='=x': must be KEY=VALUE"),
    ({**ENV, s.IDEMPOTENCY_TTL_ENV: "0"}, "TRAINGUARD_IDEMPOTENCY_TTL_S='0': must be a positive"),
])
def test_a_bad_variable_is_named_in_the_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(s.ConfigError, match=message):
        s.Settings.from_env(env)
