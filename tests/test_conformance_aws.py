"""The AWS stack's alarms, budgets, log group and subscription, and EventBridge rules as
the API calls the Terraform provider makes for them, checked against botocore's own
service models (the installed botocore, Apache-2.0): required members, types, lengths and
ranges (botocore's ParamValidator) and the enums the model lists (which ParamValidator
does not check). No AWS account is reachable here; the models are the reference."""

from __future__ import annotations

import re
from typing import Any

import botocore.session
import pytest
from botocore.model import ListShape, Shape, StringShape, StructureShape
from botocore.validate import ParamValidator

pytestmark = pytest.mark.slow

Stack = dict[str, Any]
ARN = "arn:aws:sns:us-east-1:111122223333:trainguard-aws-dev-alarms"
REF = re.compile(r"\$\{[^}]+\}")
SESSION = botocore.session.get_session()


def resolved(value: str) -> str:
    """A Terraform reference stands for an ARN or a name known at apply."""
    return REF.sub(ARN, value)


def enum_errors(shape: Shape, value: Any, where: str) -> list[str]:
    out = []
    # botocore builds each shape as the class of its type_name (ShapeResolver.SHAPE_CLASSES)
    if isinstance(shape, StructureShape) and isinstance(value, dict):
        for k, v in value.items():
            if k in shape.members:
                out += enum_errors(shape.members[k], v, f"{where}.{k}")
    elif isinstance(shape, ListShape) and isinstance(value, list):
        for i, v in enumerate(value):
            out += enum_errors(shape.member, v, f"{where}[{i}]")
    elif isinstance(shape, StringShape) and shape.enum and value not in shape.enum:
        out.append(f"{where}: {value!r} is not one of {shape.enum}")
    return out


def check(service: str, operation: str, params: dict[str, Any]) -> None:
    model = SESSION.get_service_model(service).operation_model(operation)
    shape = model.input_shape
    assert shape is not None, f"{service} {operation} has no input"
    report = ParamValidator().validate(params, shape)
    assert not report.has_errors(), f"{service} {operation}: {report.generate_report()}"
    errors = enum_errors(shape, params, operation)
    assert not errors, errors


def alarm_params(alarm: dict[str, Any]) -> dict[str, Any]:
    return {"AlarmName": alarm["alarm_name"], "AlarmDescription": alarm["alarm_description"],
            "Namespace": alarm["namespace"], "MetricName": alarm["metric_name"],
            "Dimensions": [{"Name": k, "Value": v} for k, v in alarm["dimensions"].items()],
            "Statistic": alarm["statistic"], "Period": alarm["period"],
            "EvaluationPeriods": alarm["evaluation_periods"],
            "Threshold": float(alarm["threshold"]),
            "ComparisonOperator": alarm["comparison_operator"],
            "TreatMissingData": alarm["treat_missing_data"],
            "AlarmActions": [resolved(a) for a in alarm["alarm_actions"]],
            "OKActions": [resolved(a) for a in alarm["ok_actions"]]}


def budget_params(budget: dict[str, Any]) -> dict[str, Any]:
    return {"AccountId": "111122223333",
            "Budget": {"BudgetName": budget["name"], "BudgetType": budget["budget_type"],
                       "TimeUnit": budget["time_unit"],
                       "BudgetLimit": {"Amount": budget["limit_amount"],
                                       "Unit": budget["limit_unit"]}},
            "NotificationsWithSubscribers": [
                {"Notification": {"NotificationType": n["notification_type"],
                                  "ComparisonOperator": n["comparison_operator"],
                                  "Threshold": float(n["threshold"]),
                                  "ThresholdType": n["threshold_type"]},
                 "Subscribers": [{"SubscriptionType": "SNS", "Address": resolved(a)}
                                 for a in n["subscriber_sns_topic_arns"]]}
                for n in budget["notification"]]}


def test_alarms_are_valid_put_metric_alarm_calls(stacks: dict[str, Stack]) -> None:
    alarms = stacks["aws-dev"]["resource"]["aws_cloudwatch_metric_alarm"]
    assert alarms
    for alarm in alarms.values():
        check("cloudwatch", "PutMetricAlarm", alarm_params(alarm))


def test_budgets_are_valid_create_budget_calls(stacks: dict[str, Stack]) -> None:
    for budget in stacks["aws-dev"]["resource"]["aws_budgets_budget"].values():
        params = budget_params(budget)
        check("budgets", "CreateBudget", params)
        # the service's limit on notifications per budget
        assert len(params["NotificationsWithSubscribers"]) <= 5


def test_log_group_and_subscription_are_valid_logs_calls(stacks: dict[str, Stack]) -> None:
    res = stacks["aws-dev"]["resource"]
    for group in res["aws_cloudwatch_log_group"].values():
        name = resolved(group["name"])
        check("logs", "CreateLogGroup", {"logGroupName": name})
        check("logs", "PutRetentionPolicy", {"logGroupName": name,
                                             "retentionInDays": group["retention_in_days"]})
    for flt in res["aws_cloudwatch_log_subscription_filter"].values():
        check("logs", "PutSubscriptionFilter", {
            "logGroupName": "/aws/sagemaker/TrainingJobs", "filterName": flt["name"],
            "filterPattern": flt["filter_pattern"],
            "destinationArn": resolved(flt["destination_arn"])})


def test_event_rules_are_valid_put_rule_calls(stacks: dict[str, Stack]) -> None:
    for rule in stacks["aws-dev"]["resource"]["aws_cloudwatch_event_rule"].values():
        params = {"Name": rule["name"], "Description": rule["description"]}
        if "schedule_expression" in rule:
            params["ScheduleExpression"] = rule["schedule_expression"]
        if "event_pattern" in rule:
            params["EventPattern"] = rule["event_pattern"]
        check("events", "PutRule", params)


def test_the_check_catches_a_mistake(stacks: dict[str, Stack]) -> None:
    """It can fail: a statistic, a budget unit or a missing member the model refuses."""
    alarm = alarm_params(next(iter(
        stacks["aws-dev"]["resource"]["aws_cloudwatch_metric_alarm"].values())))
    with pytest.raises(AssertionError, match="Statistic"):
        check("cloudwatch", "PutMetricAlarm", {**alarm, "Statistic": "Max"})
    budget = budget_params(next(iter(
        stacks["aws-dev"]["resource"]["aws_budgets_budget"].values())))
    # not a unit in any model (WEEKLY was none until botocore 1.44.18 added it)
    budget["Budget"]["TimeUnit"] = "FORTNIGHTLY"
    with pytest.raises(AssertionError, match="TimeUnit"):
        check("budgets", "CreateBudget", budget)
    with pytest.raises(AssertionError, match="logGroupName"):
        check("logs", "PutSubscriptionFilter", {"filterName": "x", "filterPattern": "",
                                                "destinationArn": ARN})


def dropped(raw: Any, parsed: Any, where: str) -> list[str]:
    """Members of a recorded body that botocore's parser did not keep: not in the model."""
    if isinstance(raw, dict) and isinstance(parsed, dict):
        out = [f"{where}.{k}" for k in raw if k not in parsed]
        return out + [x for k in raw if k in parsed
                      for x in dropped(raw[k], parsed[k], f"{where}.{k}")]
    if isinstance(raw, list) and isinstance(parsed, list):
        return [x for i, (a, b) in enumerate(zip(raw, parsed, strict=False))
                for x in dropped(a, b, f"{where}[{i}]")]
    return []


def test_sagemaker_recordings_hold_only_the_models_members() -> None:
    """Every recorded SageMaker answer the adapter tests replay is in the shape of
    botocore's model: nothing the real service could not send."""
    from tests.sagemaker_replay import Recordings, parse

    recordings = Recordings()
    checked = 0
    for stem, rec in recordings.files.items():
        if "operation" not in rec:
            continue
        body = rec["response"]
        assert dropped(body, parse(rec["operation"], body), stem) == []
        checked += 1
    assert checked >= 10
