"""The AWS stack: the watchdog Lambda on a schedule and on SageMaker state changes,
its DynamoDB state, an SNS topic for alarms, CloudWatch alarms, dashboard and log
subscription, AWS Budgets from the policy, and an IAM role with least privilege."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cdktn import AssetType, Fn, TerraformAsset, TerraformOutput, TerraformStack
from cdktn_provider_aws.budgets_budget import BudgetsBudget, BudgetsBudgetNotification
from cdktn_provider_aws.cloudwatch_dashboard import CloudwatchDashboard
from cdktn_provider_aws.cloudwatch_event_rule import CloudwatchEventRule
from cdktn_provider_aws.cloudwatch_event_target import CloudwatchEventTarget
from cdktn_provider_aws.cloudwatch_log_group import CloudwatchLogGroup
from cdktn_provider_aws.cloudwatch_log_subscription_filter import (
    CloudwatchLogSubscriptionFilter,
)
from cdktn_provider_aws.cloudwatch_metric_alarm import CloudwatchMetricAlarm
from cdktn_provider_aws.data_aws_ssm_parameter import DataAwsSsmParameter
from cdktn_provider_aws.dynamodb_table import (
    DynamodbTable,
    DynamodbTableAttribute,
    DynamodbTablePointInTimeRecovery,
    DynamodbTableServerSideEncryption,
    DynamodbTableTtl,
)
from cdktn_provider_aws.iam_policy import IamPolicy
from cdktn_provider_aws.iam_role import IamRole
from cdktn_provider_aws.iam_role_policy import IamRolePolicy
from cdktn_provider_aws.kms_alias import KmsAlias
from cdktn_provider_aws.kms_key import KmsKey
from cdktn_provider_aws.lambda_function import (
    LambdaFunction,
    LambdaFunctionDeadLetterConfig,
    LambdaFunctionEnvironment,
    LambdaFunctionLoggingConfig,
)
from cdktn_provider_aws.lambda_permission import LambdaPermission
from cdktn_provider_aws.provider import AwsProvider, AwsProviderDefaultTags
from cdktn_provider_aws.sns_topic import SnsTopic
from cdktn_provider_aws.sns_topic_policy import SnsTopicPolicy
from cdktn_provider_aws.sns_topic_subscription import SnsTopicSubscription
from cdktn_provider_aws.sqs_queue import SqsQueue
from constructs import Construct

from trainguard.checker.logship import cloudwatch_pattern
from trainguard.checker.model import Action, Severity
from trainguard.checker.registry import rule_names
from trainguard.config.settings.aws import Settings as AwsSettings
from trainguard.stacks import package
from trainguard.stacks.base import covers, local_state
from trainguard.stacks.dashboards import cloudwatch
from trainguard.stacks.environment import AwsEnvironment, Environment, TrainingLogGroup

#: the findings metrics the Lambda publishes (EMF); tests/test_seams.py holds them equal
#: to what lambdas/aws/sinks.py emits
NAMESPACE = "trainguard"
FINDINGS = "Findings"  # dimensions: account, rule, severity; a count per tick
SPEND = "SpendUSDPerHour"  # dimensions: account; the hourly burn of running jobs
JOBS = "Jobs"  # dimensions: account, verdict; jobs per verdict per tick
SAGEMAKER_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
BUDGET_UNITS = {"day": "DAILY", "month": "MONTHLY"}  # AWS Budgets has no weekly budget
TTL_ATTRIBUTE = "expires_at"  # what lambdas/aws/dynamodb_state.py and the idempotency write
#: the calls lambdas/aws/dynamodb_state.py and powertools' idempotency layer make on the
#: table: GetItem, PutItem, UpdateItem, DeleteItem, Query, BatchWriteItem (audit records,
#: 25 a call), and TransactWriteItems of Puts (IAM checks a transaction's items against
#: their own actions: PutItem). No Scan, no ConditionCheck items.
STATE_ACTIONS = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
                 "dynamodb:DeleteItem", "dynamodb:Query", "dynamodb:BatchWriteItem")
#: the partition key of audit records (lambdas/aws/dynamodb_state.py): never updated or
#: deleted by the function, so a compromised function cannot rewrite its own trail
AUDIT_PARTITION = "audit"


def tag_guard(spec: AwsEnvironment, protect_tag: str) -> list[dict[str, Any]]:
    """The optional guard rail on the tags that authorise a stop (docs/security.md): no
    one under it adds or removes ``trainguard:*`` tags (nor the stop opt-in tag, nor the
    policy's protect tag), and, with ``require_stop_tag``, no training job is created
    without the opt-in tag. The same statements serve as a permissions boundary (with an
    Allow of everything else) and as an organisation SCP (with ``tag_admins`` exempt)."""
    keys = sorted({"trainguard:*", spec.stop_tag.key, protect_tag})
    admins = {"ArnNotLike": {"aws:PrincipalArn": spec.guard_rails.tag_admins}} \
        if spec.guard_rails.tag_admins else {}
    out: list[dict[str, Any]] = [
        {"Sid": "NoTrainguardTagChanges", "Effect": "Deny",
         "Action": ["sagemaker:AddTags", "sagemaker:DeleteTags"],
         "Resource": f"arn:aws:sagemaker:*:{spec.account}:training-job/*",
         "Condition": {"ForAnyValue:StringLike": {"aws:TagKeys": keys}, **admins}}]
    if spec.guard_rails.require_stop_tag:
        out.append(
            {"Sid": "TrainingJobsCarryTheOptInTag", "Effect": "Deny",
             "Action": ["sagemaker:CreateTrainingJob"],
             "Resource": f"arn:aws:sagemaker:*:{spec.account}:training-job/*",
             "Condition": {"Null": {f"aws:RequestTag/{spec.stop_tag.key}": "true"}}})
    return out


#: AWS Budgets offers FORECASTED notifications on MONTHLY, QUARTERLY and ANNUALLY
#: budgets only, not on DAILY ones (the API rejects them)
FORECAST_UNITS = frozenset({"MONTHLY", "QUARTERLY", "ANNUALLY"})
MAX_BUDGET_NOTIFICATIONS = 5  # AWS Budgets' limit per budget


def budget_notifications(unit: str, alert_at: list[float]) -> list[tuple[str, float]]:
    """(notification type, percent) of a budget: the policy's thresholds on actual spend,
    and, where the time unit has a forecast, the forecast passing the limit; at most
    five, the forecast kept and the highest actual thresholds dropped first."""
    forecast = [("FORECASTED", 100.0)] if unit in FORECAST_UNITS else []
    room = MAX_BUDGET_NOTIFICATIONS - len(forecast)
    percents = sorted({round(f * 100, 2) for f in alert_at})[:room]
    return [*(("ACTUAL", p) for p in percents), *forecast]


def training_log_group(scope: Construct, want: TrainingLogGroup) -> CloudwatchLogGroup:
    """SageMaker's log group, created with its retention, or adopted (a Terraform import
    block) where it exists already: either way the stack owns it before subscribing."""
    group = CloudwatchLogGroup(scope, "training_log_group", name=SAGEMAKER_LOG_GROUP,
                               retention_in_days=want.retention_days)
    if want.exists:
        group.import_from(SAGEMAKER_LOG_GROUP)
    return group


def alarm_period(interval_minutes: int) -> int:
    """A CloudWatch alarm's period on a metric published once a tick: at least one tick
    (else the alarm flips to OK between two ticks that both saw a finding), at least
    5 minutes, a whole number of minutes, at most a day (CloudWatch's limit)."""
    return min(max(300, interval_minutes * 60), 86400)


def _doc(*statements: dict[str, Any]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)}, indent=1)


class AwsStack(TerraformStack):
    def __init__(self, scope: Construct, env: Environment, build_dir: Path) -> None:
        super().__init__(scope, env.name)
        spec = env.spec
        assert isinstance(spec, AwsEnvironment)
        self.env = env
        self.spec = spec
        name = f"trainguard-{spec.name}"
        self.prefix = name
        local_state(self, env.name)
        AwsProvider(self, "aws", region=spec.region, allowed_account_ids=[spec.account],
                    default_tags=[AwsProviderDefaultTags(tags={
                        "app": "trainguard", "trainguard:environment": spec.name,
                        **spec.tags})])
        self.arn = f"arn:aws:{{}}:{spec.region}:{spec.account}:{{}}"

        self.key = self._kms_key()
        self.table = DynamodbTable(
            self, "state", name=f"{name}-state", billing_mode="PAY_PER_REQUEST",
            hash_key="pk", range_key="sk",
            attribute=[DynamodbTableAttribute(name="pk", type="S"),
                       DynamodbTableAttribute(name="sk", type="S")],
            ttl=DynamodbTableTtl(attribute_name=TTL_ATTRIBUTE, enabled=True),
            point_in_time_recovery=DynamodbTablePointInTimeRecovery(enabled=True),
            server_side_encryption=DynamodbTableServerSideEncryption(
                enabled=True, kms_key_arn=self.key.arn),
            deletion_protection_enabled=True)
        self.topic = self._topic()
        self.function = self._function(build_dir)
        self._triggers()
        self._alarms()
        self._dashboard()
        self._budgets()
        TerraformOutput(self, "function_name", value=self.function.function_name)
        TerraformOutput(self, "topic_arn", value=self.topic.arn)
        TerraformOutput(self, "state_table", value=self.table.name)
        if spec.guard_rails.tag_boundary:
            self._guard_rails()

    # --- encryption ---------------------------------------------------------------------

    def _kms_key(self) -> KmsKey:
        spec = self.spec
        root = f"arn:aws:iam::{spec.account}:root"
        # Who publishes to the encrypted topic (EventBridge invokes the function and
        # writes nothing encrypted: it needs no key).
        services = ["cloudwatch.amazonaws.com", "budgets.amazonaws.com", "sns.amazonaws.com"]
        policy = _doc(
            {"Sid": "AccountAdmin", "Effect": "Allow", "Principal": {"AWS": root},
             "Action": "kms:*", "Resource": "*"},
            # Alarms and budgets publish to the encrypted topic, so they must use the key.
            {"Sid": "AlarmSources", "Effect": "Allow", "Principal": {"Service": services},
             "Action": ["kms:Decrypt", "kms:GenerateDataKey*"], "Resource": "*",
             "Condition": {"StringEquals": {"aws:SourceAccount": spec.account}}},
            {"Sid": "Logs", "Effect": "Allow",
             "Principal": {"Service": f"logs.{spec.region}.amazonaws.com"},
             "Action": ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*",
                        "kms:GenerateDataKey*", "kms:Describe*"], "Resource": "*",
             # Only the function's own log group, not any log group of the account.
             "Condition": {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn":
                                         self.arn.format("logs", f"log-group:/aws/lambda/"
                                                                 f"{self.prefix}")}}},
        )
        key = KmsKey(self, "key", description=f"{self.prefix}: state, alarms and logs",
                     enable_key_rotation=True, deletion_window_in_days=30, policy=policy)
        KmsAlias(self, "key_alias", name=f"alias/{self.prefix}", target_key_id=key.key_id)
        return key

    # --- alarms topic -------------------------------------------------------------------

    def _topic(self) -> SnsTopic:
        spec = self.spec
        topic = SnsTopic(self, "alarms", name=f"{self.prefix}-alarms",
                         kms_master_key_id=self.key.arn)
        SnsTopicPolicy(self, "alarms_policy", arn=topic.arn, policy=_doc(
            {"Sid": "AlarmsAndBudgets", "Effect": "Allow",
             "Principal": {"Service": ["cloudwatch.amazonaws.com", "budgets.amazonaws.com"]},
             "Action": "SNS:Publish", "Resource": topic.arn,
             "Condition": {"StringEquals": {"aws:SourceAccount": spec.account}}}))
        for i, email in enumerate(spec.alarms.emails):
            SnsTopicSubscription(self, f"email_{i}", topic_arn=topic.arn, protocol="email",
                                 endpoint=email)
        for hook in spec.alarms.webhooks:
            # The URL is a secret: read from SSM at deploy time, never in the repository
            # (Terraform state still holds it: keep the state encrypted, docs/security.md).
            url = DataAwsSsmParameter(self, f"webhook_{hook.name}_url",
                                      name=str(hook.ssm_parameter), with_decryption=True)
            SnsTopicSubscription(self, f"webhook_{hook.name}", topic_arn=topic.arn,
                                 protocol="https", endpoint=url.value,
                                 endpoint_auto_confirms=False)
        return topic

    # --- the function -------------------------------------------------------------------

    def _function(self, build_dir: Path) -> LambdaFunction:
        spec, name = self.spec, self.prefix
        zipped = package.build(self.env.policy_path, build_dir / f"{spec.name}-lambda.zip")
        asset = TerraformAsset(self, "package", path=str(zipped.path), type=AssetType.FILE)
        log_group = CloudwatchLogGroup(self, "function_logs", name=f"/aws/lambda/{name}",
                                       retention_in_days=spec.log_retention_days,
                                       kms_key_id=self.key.arn)
        dlq = SqsQueue(self, "dead_letters", name=f"{name}-dead-letters",
                       kms_master_key_id=self.key.arn, message_retention_seconds=1209600)
        role = IamRole(self, "role", name=name, assume_role_policy=_doc(
            {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
             "Action": "sts:AssumeRole",
             "Condition": {"StringEquals": {"aws:SourceAccount": spec.account}}}))
        IamRolePolicy(self, "role_policy", name=name, role=role.id,
                      policy=self._least_privilege(log_group, dlq))
        stop = self.env.spec.stop_enabled
        return LambdaFunction(
            self, "watchdog", function_name=name, role=role.arn,
            runtime="python3.11", architectures=["x86_64"], handler=package.HANDLER,
            filename=asset.path, source_code_hash=Fn.filebase64sha256(asset.path),
            timeout=300, memory_size=1024,
            # One tick at a time: two concurrent ticks could both decide to stop a job.
            reserved_concurrent_executions=1,
            kms_key_arn=self.key.arn,
            dead_letter_config=LambdaFunctionDeadLetterConfig(target_arn=dlq.arn),
            logging_config=LambdaFunctionLoggingConfig(log_format="JSON",
                                                       log_group=log_group.name),
            environment=LambdaFunctionEnvironment(variables={
                **AwsSettings(
                    table=self.table.name, region=spec.region, topic_arn=self.topic.arn,
                    policy=package.POLICY_NAME, stop_enabled=stop,
                    stop_tag=(spec.stop_tag.key, spec.stop_tag_value), environment=spec.name,
                    interval_s=spec.tick.tick_seconds()).to_env(),
                "POWERTOOLS_SERVICE_NAME": "trainguard",
                "POWERTOOLS_METRICS_NAMESPACE": NAMESPACE,
            }),
            depends_on=[log_group])

    def _least_privilege(self, log_group: CloudwatchLogGroup, dlq: SqsQueue) -> str:
        spec, arn = self.spec, self.arn
        jobs = arn.format("sagemaker", "training-job/*")
        statements: list[dict[str, Any]] = [
            # List actions have no resource type: "*" is the narrowest IAM allows.
            {"Sid": "ListJobs", "Effect": "Allow", "Action": ["sagemaker:ListTrainingJobs"],
             "Resource": "*"},
            {"Sid": "ReadJobs", "Effect": "Allow",
             "Action": ["sagemaker:DescribeTrainingJob", "sagemaker:ListTags"],
             "Resource": jobs},
            # GetMetricData has no resource type either. No PutMetricData: the findings
            # metrics are EMF lines in the function's own log (lambdas/aws/sinks.py).
            {"Sid": "ReadMetrics", "Effect": "Allow", "Action": ["cloudwatch:GetMetricData"],
             "Resource": "*"},
            {"Sid": "ReadTrainingLogs", "Effect": "Allow", "Action": ["logs:FilterLogEvents"],
             "Resource": arn.format("logs", f"log-group:{SAGEMAKER_LOG_GROUP}:*")},
            {"Sid": "OwnLogs", "Effect": "Allow",
             "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
             "Resource": f"{log_group.arn}:*"},
            {"Sid": "State", "Effect": "Allow", "Action": list(STATE_ACTIONS),
             "Resource": self.table.arn},
            {"Sid": "AuditIsAppendOnly", "Effect": "Deny",
             "Action": ["dynamodb:UpdateItem", "dynamodb:DeleteItem"],
             "Resource": self.table.arn,
             "Condition": {"ForAnyValue:StringEquals": {
                 "dynamodb:LeadingKeys": [AUDIT_PARTITION]}}},
            {"Sid": "Alarm", "Effect": "Allow", "Action": ["sns:Publish"],
             "Resource": self.topic.arn},
            {"Sid": "DeadLetters", "Effect": "Allow", "Action": ["sqs:SendMessage"],
             "Resource": dlq.arn},
            {"Sid": "Key", "Effect": "Allow",
             "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": self.key.arn},
        ]
        if spec.stop_enabled:
            statements.append(
                {"Sid": "StopTaggedJobs", "Effect": "Allow",
                 "Action": ["sagemaker:StopTrainingJob"], "Resource": jobs,
                 "Condition": {"StringEquals": {
                     f"aws:ResourceTag/{spec.stop_tag.key}": spec.stop_tag_value}}})
            # The policy's protect tag refuses the stop in IAM too, whatever the tick
            # decided (any value but "false", as lambdas/tick.py reads it).
            protect = self.env.policy.safety.protect_tag
            statements.append(
                {"Sid": "NeverStopProtectedJobs", "Effect": "Deny",
                 "Action": ["sagemaker:StopTrainingJob"], "Resource": jobs,
                 "Condition": {"Null": {f"aws:ResourceTag/{protect}": "false"},
                               "StringNotEqualsIgnoreCase": {
                                   f"aws:ResourceTag/{protect}": "false"}}})
        return _doc(*statements)

    def _guard_rails(self) -> None:
        """The tag guard as a managed policy to attach to the teams' roles or to use as
        their permissions boundary, and as an SCP document for the organisation."""
        guard = tag_guard(self.spec, self.env.policy.safety.protect_tag)
        boundary = [*guard, {"Sid": "EverythingElse", "Effect": "Allow", "Action": "*",
                             "Resource": "*"}]
        policy = IamPolicy(self, "tag_guard", name=f"{self.prefix}-tag-guard",
                           description="trainguard: no one changes the tags that authorise "
                                       "a stop (docs/security.md)",
                           policy=_doc(*boundary))
        TerraformOutput(self, "tag_guard_boundary_arn", value=policy.arn)
        TerraformOutput(self, "tag_guard_scp", value=_doc(*guard))

    # --- triggers -----------------------------------------------------------------------

    def _invoke(self, rule_id: str, rule: CloudwatchEventRule) -> None:
        CloudwatchEventTarget(self, f"{rule_id}_target", rule=rule.name,
                              arn=self.function.arn, target_id="watchdog")
        LambdaPermission(self, f"{rule_id}_invoke", action="lambda:InvokeFunction",
                         function_name=self.function.function_name,
                         principal="events.amazonaws.com", source_arn=rule.arn,
                         statement_id=f"{rule_id}-invoke")

    def _triggers(self) -> None:
        spec = self.spec
        tick = CloudwatchEventRule(self, "tick", name=f"{self.prefix}-tick",
                                   description="the watchdog's tick",
                                   schedule_expression=spec.tick.aws())
        self._invoke("tick", tick)
        change = CloudwatchEventRule(
            self, "job_state", name=f"{self.prefix}-job-state",
            description="SageMaker training job state changes",
            event_pattern=json.dumps({"source": ["aws.sagemaker"],
                                      "detail-type": ["SageMaker Training Job State Change"]}))
        self._invoke("job_state", change)
        LambdaPermission(self, "logs_invoke", action="lambda:InvokeFunction",
                         function_name=self.function.function_name,
                         principal=f"logs.{spec.region}.amazonaws.com",
                         source_arn=self.arn.format("logs",
                                                    f"log-group:{SAGEMAKER_LOG_GROUP}:*"),
                         statement_id="logs-invoke")
        # SageMaker makes its log group at a job's first line: in an account where no job
        # has logged yet, a subscription to it fails the apply. The stack owns the group
        # (or adopts the one there) and subscribes after it. A log group takes at most
        # two subscription filters (docs/alarms-aws.md).
        group = training_log_group(self, spec.training_log_group)
        CloudwatchLogSubscriptionFilter(
            self, "training_logs", name=f"{self.prefix}-signatures",
            log_group_name=group.name, destination_arn=self.function.arn,
            filter_pattern=cloudwatch_pattern(), depends_on=[group])

    # --- alarms, dashboard, budgets -----------------------------------------------------

    def _alarms(self) -> None:
        """One alarm per enabled rule and severity the policy acts on."""
        spec, policy = self.spec, self.env.policy
        actions = [self.topic.arn]
        period = alarm_period(spec.tick.interval_minutes())
        for rule in rule_names():
            cfg = policy.rule(rule)
            if not cfg.enabled:
                continue
            for severity in (Severity.CRITICAL, Severity.WARNING):
                if cfg.actions.get(severity, Action.NONE) is Action.NONE:
                    continue
                CloudwatchMetricAlarm(
                    self, f"alarm_{rule}_{severity.value}",
                    alarm_name=f"{self.prefix}-{rule}-{severity.value}",
                    alarm_description=f"trainguard: {severity.value} {rule} findings in "
                                      f"{spec.account} (the Lambda's message names the job)",
                    namespace=NAMESPACE, metric_name=FINDINGS,
                    dimensions={"account": spec.account, "rule": rule,
                                "severity": severity.value},
                    statistic="Maximum", period=period, evaluation_periods=1,
                    threshold=0, comparison_operator="GreaterThanThreshold",
                    treat_missing_data="notBreaching",
                    alarm_actions=actions, ok_actions=actions)

    def _dashboard(self) -> None:
        """The fleet views and one tile per rule (stacks/dashboards/cloudwatch.py)."""
        body = cloudwatch.dashboard_body(self.spec.account, self.spec.region)
        CloudwatchDashboard(self, "dashboard", dashboard_name=self.prefix,
                            dashboard_body=json.dumps(body, sort_keys=True))

    def _budgets(self) -> None:
        """An AWS Budgets budget per account budget of the policy that covers this
        account (scope ``*`` or the account id) and a period AWS Budgets has."""
        spec, policy = self.spec, self.env.policy
        for i, acct in enumerate(policy.budget.accounts):
            unit = BUDGET_UNITS.get(acct.period)
            if unit is None or not covers(acct.scope, spec.account):
                continue  # another account's, or weekly: the watchdog's budget rule covers it
            notifications = [
                BudgetsBudgetNotification(
                    comparison_operator="GREATER_THAN", notification_type=kind,
                    threshold=percent, threshold_type="PERCENTAGE",
                    subscriber_sns_topic_arns=[self.topic.arn])
                for kind, percent in budget_notifications(unit, policy.budget.alert_at)]
            BudgetsBudget(self, f"budget_{i}", name=f"{self.prefix}-{acct.period}-{i}",
                          budget_type="COST", limit_amount=f"{acct.limit_usd:.2f}",
                          limit_unit="USD", time_unit=unit, notification=notifications)
