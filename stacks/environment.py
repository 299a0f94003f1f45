"""Environments as data: ``environments/<name>.yaml``, one deployable stack each.

Every environment has a ``name`` (equal to the file's stem, so ``cdktn deploy aws-dev``
is ``environments/aws-dev.yaml``), a ``cloud`` (``aws``, ``azure`` or ``openshift``),
a ``schedule`` (``rate(N minutes)`` or ``cron(M H DOM MON DOW)``, five standard fields,
UTC), a ``policy`` (a policy file, relative to the repository), ``alarms``
(``emails`` and ``webhooks``) and ``stop_enabled``. Each cloud adds its own fields
(see the models below). The policy is loaded with ``trainguard.config.load_policy``, so
a bad policy fails synth with its own file and line.

Every problem is reported as ``FILE:LINE: FIELD: reason``, all at once.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainguard.checker.policy import Policy
from trainguard.config import (
    Loc,
    PolicyError,
    Problem,
    dotted,
    line_of,
    load_policy,
    load_yaml,
    validation_problems,
)

ROOT = Path(__file__).resolve().parent.parent
ENVIRONMENTS = ROOT / "environments"

_STRICT = ConfigDict(extra="forbid", strict=True)
Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{1,30}[a-z0-9]$")]
#: a Kubernetes namespace or label value (DNS-1123 label)
K8sName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]


class EnvironmentFileError(PolicyError):
    """Everything wrong with environment files (and their policies), one line per problem,
    grouped by file."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems)
        self.problems = sorted(problems, key=lambda p: (p.file, p.line or 0, p.field))
        self.args = ("\n".join(str(p) for p in self.problems),)

    def __str__(self) -> str:
        return str(self.args[0])


# ------------------------------------------------------------------------- schedule


_RATE = re.compile(r"^rate\((\d+) (minute|minutes|hour|hours)\)$")
_CRON = re.compile(r"^cron\(([^()]+)\)$")
_CRON_FIELD = re.compile(r"^[0-9*/,-]+$")


@dataclass(frozen=True)
class Schedule:
    """A tick schedule in the one form each platform wants."""

    minutes: int | None  # rate(...) in minutes, else None
    cron: str | None  # five standard fields, else None

    @classmethod
    def parse(cls, text: str) -> Schedule:
        if m := _RATE.match(text):
            n = int(m.group(1)) * (60 if m.group(2).startswith("hour") else 1)
            if n < 1:
                raise ValueError("a rate must be at least 1 minute")
            if n != 1 and m.group(2) in ("minute", "hour"):
                raise ValueError(f"say 'rate({m.group(1)} {m.group(2)}s)' (plural)")
            return cls(minutes=n, cron=None)
        if m := _CRON.match(text):
            fields = m.group(1).split()
            if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
                raise ValueError("a cron has five fields of digits, '*', '/', ',' or '-': "
                                 "minute hour day-of-month month day-of-week (UTC)")
            return cls(minutes=None, cron=" ".join(fields))
        raise ValueError("expected 'rate(N minutes)', 'rate(N hours)' or "
                         "'cron(M H DOM MON DOW)'")

    def standard_cron(self) -> str:
        """Five-field cron (Kubernetes CronJob); a rate must divide an hour or a day."""
        if self.cron is not None:
            return self.cron
        n = self.minutes or 0
        if n < 60 and 60 % n == 0:
            return "* * * * *" if n == 1 else f"*/{n} * * * *"
        if n % 60 == 0 and 24 % (n // 60) == 0:
            return "0 * * * *" if n == 60 else f"0 */{n // 60} * * *"
        raise ValueError(f"rate({n} minutes) has no cron form: use a rate dividing an hour "
                         "or a day, or cron(...)")

    def aws(self) -> str:
        """EventBridge: rate(...) as is, else cron with six fields and one '?'."""
        if self.minutes is not None:
            n = self.minutes
            if n % 60 == 0:
                hours = n // 60
                return f"rate({hours} hour{'s' if hours > 1 else ''})"
            return f"rate({n} minute{'s' if n > 1 else ''})"
        mi, h, dom, mon, dow = (self.cron or "").split()
        # EventBridge wants exactly one of day-of-month and day-of-week as '?'.
        if dow == "*":
            dow = "?"
        elif dom == "*":
            dom, dow = "?", eventbridge_days(dow)
        else:
            # Standard cron runs on either day; EventBridge cannot say "either".
            raise ValueError(f"cron({self.cron}) restricts both the day of month and the "
                             "day of week; EventBridge takes only one: keep one as '*'")
        return f"cron({mi} {h} {dom} {mon} {dow} *)"

    def ncrontab(self) -> str:
        """Azure Functions timer: six fields, seconds first."""
        return "0 " + self.standard_cron()

    def interval_minutes(self) -> int:
        """The longest wait between two ticks, in minutes: what an alert on the
        watchdog's output must span (a metric published once a tick, a heartbeat). A
        cron restricting the day of month or the month counts as a month."""
        if self.minutes is not None:
            return self.minutes
        mi, h, dom, mon, dow = (self.cron or "").split()
        if dom != "*" or mon != "*":
            return 31 * 24 * 60
        week = [d * 1440 + hh * 60 + m for d in sorted(_expand(dow, 0, 7, sunday=True))
                for hh in sorted(_expand(h, 0, 23)) for m in sorted(_expand(mi, 0, 59))]
        if not week:
            raise ValueError(f"cron({self.cron}) never fires")
        week.sort()
        gaps = [b - a for a, b in itertools.pairwise(week)]
        return max([*gaps, week[0] + 7 * 1440 - week[-1]])


    def tick_seconds(self) -> float:
        """The usual wait between two ticks, in seconds: what the runtimes tell the tick
        (``interval_s``), so that a finding must persist over time and a retried
        invocation does not count twice. For a cron, the shortest gap: the longest
        (a weekend) would make every weekday tick look like a retry."""
        if self.minutes is not None:
            return self.minutes * 60.0
        mi, h, _dom, _mon, dow = (self.cron or "").split()
        week = sorted(d * 1440 + hh * 60 + m for d in _expand(dow, 0, 7, sunday=True)
                      for hh in _expand(h, 0, 23) for m in _expand(mi, 0, 59))
        if not week:
            raise ValueError(f"cron({self.cron}) never fires")
        gaps = [b - a for a, b in itertools.pairwise(week)] + [week[0] + 7 * 1440 - week[-1]]
        return min(gaps) * 60.0


#: EventBridge's day-of-week names in its own order: it counts 1-7 from Sunday (SUN=1),
#: where standard cron counts 0-6 from Sunday (and 7 is Sunday again). Names are written
#: so a number can never be read in the wrong convention.
EVENTBRIDGE_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


def eventbridge_days(dow: str) -> str:
    """A standard-cron day-of-week field as EventBridge names, runs of days as ranges:
    ``1-5`` (Monday to Friday) is ``MON-FRI``, ``0`` and ``7`` are ``SUN``."""
    days = sorted(_expand(dow, 0, 7, sunday=True))
    runs: list[list[int]] = []
    for d in days:
        if runs and d == runs[-1][-1] + 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    return ",".join(EVENTBRIDGE_DAYS[r[0]] if len(r) == 1 else
                    f"{EVENTBRIDGE_DAYS[r[0]]}-{EVENTBRIDGE_DAYS[r[-1]]}" for r in runs)


def _expand(field: str, low: int, high: int, sunday: bool = False) -> set[int]:
    """The values one cron field names: ``*``, ``N``, ``A-B``, each with ``/STEP``,
    comma-separated. Day of week 7 is Sunday (0)."""
    out: set[int] = set()
    for part in field.split(","):
        rng, _, step = part.partition("/")
        if rng == "*":
            a, b = low, (6 if sunday else high)
        elif "-" in rng:
            a, b = (int(x) for x in rng.split("-", 1))
        else:
            a = b = int(rng)
        if not (low <= a <= b <= high):
            raise ValueError(f"cron field {field!r}: {part!r} is outside {low}-{high}")
        out.update(range(a, b + 1, int(step) if step else 1))
    return {0 if sunday and v == 7 else v for v in out}


# ---------------------------------------------------------------------------- models


class SecretKeyRef(BaseModel):
    """A key of a Kubernetes Secret (AlertmanagerConfig ``urlSecret``)."""

    model_config = _STRICT
    name: K8sName
    key: str = Field(pattern=r"^[-._a-zA-Z0-9]+$")


class KeyVaultSecret(BaseModel):
    """A Key Vault secret: the vault's resource id and the secret's name."""

    model_config = _STRICT
    vault_id: str = Field(pattern=r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/"
                                  r"Microsoft\.KeyVault/vaults/[A-Za-z0-9-]{3,24}$")
    secret: str = Field(pattern=r"^[A-Za-z0-9-]{1,127}$")

    @property
    def vault_name(self) -> str:
        return self.vault_id.rsplit("/", 1)[-1]


class Webhook(BaseModel):
    """A chat or relay webhook. Its URL is a secret (whoever holds it posts to the
    channel), so it is never written here: each cloud reads it from its secret store."""

    model_config = _STRICT
    name: Name
    url: str | None = None  # refused, with the reason: see ``_no_url``
    ssm_parameter: str | None = Field(default=None, pattern=r"^/[\w./-]+$")  # AWS
    key_vault: KeyVaultSecret | None = None  # Azure
    secret: SecretKeyRef | None = None  # OpenShift: in each namespace with alerts

    @field_validator("url")
    @classmethod
    def _no_url(cls, v: str | None) -> str | None:
        if v is not None:
            raise ValueError("a webhook URL is a secret: never write it in the repository; "
                             "give ssm_parameter (AWS), key_vault {vault_id, secret} (Azure) "
                             "or secret {name, key} (OpenShift) instead")
        return v

    def source(self) -> str | None:
        """Which secret store the URL comes from (the field that is set)."""
        given = [k for k in WEBHOOK_SOURCES if getattr(self, k) is not None]
        return given[0] if len(given) == 1 else None


#: the fields a webhook's URL can come from, one per cloud
WEBHOOK_SOURCES = ("ssm_parameter", "key_vault", "secret")


Email = Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")]


class Alarms(BaseModel):
    """Where alarms go: each cloud turns these into its own receivers (SNS
    subscriptions, Action Group receivers, Alertmanager receivers)."""

    model_config = _STRICT
    emails: list[Email] = []
    webhooks: list[Webhook] = []


class Common(BaseModel):
    model_config = _STRICT
    cloud: ClassVar[str]
    webhook_source: ClassVar[str]  # the one of WEBHOOK_SOURCES this cloud reads
    name: Name
    schedule: str = "rate(5 minutes)"
    policy: str = Field(min_length=1)
    alarms: Alarms = Field(default_factory=Alarms)
    stop_enabled: bool = False
    tags: dict[str, str] = {}

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str) -> str:
        Schedule.parse(v)
        return v

    @field_validator("alarms")
    @classmethod
    def _webhook_sources(cls, v: Alarms) -> Alarms:
        for i, hook in enumerate(v.webhooks):
            if hook.source() != cls.webhook_source:
                raise ValueError(f"webhooks[{i}] ({hook.name}): on {cls.cloud} the URL comes "
                                 f"from {cls.webhook_source} (and only from it)")
        return v

    @property
    def tick(self) -> Schedule:
        return Schedule.parse(self.schedule)


class StopTag(BaseModel):
    model_config = _STRICT
    key: str = Field(default="trainguard:environment", min_length=1, max_length=128)
    value: str | None = None  # default: the environment's name


class GuardRails(BaseModel):
    """Optional guard rails on the tags that authorise a stop (docs/security.md)."""

    model_config = _STRICT
    tag_boundary: bool = False  # a managed policy / permissions boundary, and an SCP output
    require_stop_tag: bool = False  # with it: no training job created without the opt-in tag
    tag_admins: list[str] = []  # principal ARNs (wildcards allowed) the SCP exempts


#: the retentions CloudWatch Logs accepts (days)
Retention = Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096,
                    1827, 2192, 2557, 2922, 3288, 3653]


class TrainingLogGroup(BaseModel):
    """``/aws/sagemaker/TrainingJobs``: SageMaker creates it at a job's first log line, so
    in a new account it is not there and the log subscription cannot be made. The stack
    creates it (``exists: false``) or adopts the one there (``exists: true``, a Terraform
    import); either way with this retention. ``trainguard preflight`` says which."""

    model_config = _STRICT
    exists: bool = False
    #: on an adopted group this applies to the logs already there: check preflight's
    #: report of the current retention first
    retention_days: Retention = 365


class AwsEnvironment(Common):
    cloud: ClassVar[str] = "aws"
    webhook_source: ClassVar[str] = "ssm_parameter"
    guard_rails: GuardRails = Field(default_factory=GuardRails)
    account: str = Field(pattern=r"^\d{12}$")
    region: str = Field(pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
    stop_tag: StopTag = Field(default_factory=StopTag)
    log_retention_days: Literal[7, 14, 30, 60, 90, 180, 365, 400, 545, 731] = 365
    training_log_group: TrainingLogGroup = Field(default_factory=TrainingLogGroup)

    @field_validator("schedule")
    @classmethod
    def _eventbridge(cls, v: str) -> str:
        Schedule.parse(v).aws()  # a cron EventBridge cannot express fails here, by name
        return v

    @property
    def stop_tag_value(self) -> str:
        return self.stop_tag.value or self.name


class MlWorkspace(BaseModel):
    model_config = _STRICT
    resource_group: str = Field(min_length=1)
    name: str = Field(min_length=1)


class LogQuery(BaseModel):
    """The Log Analytics workspace, table and column holding training log lines, for the
    log-signature alerts. ``ContainerLogV2`` is fed only by Container Insights on AKS or
    Arc-enabled Kubernetes (Azure ML attached Kubernetes compute): name that cluster's
    workspace. Azure ML compute clusters send no stdout to Log Analytics: without a
    ``log_query`` no query alert is made and the adapter reads each job's
    ``user_logs/std_log*.txt`` instead (docs/alarms-azure.md)."""

    model_config = _STRICT
    workspace_id: str = Field(pattern=r"(?i)^/subscriptions/[^/]+/resourceGroups/[^/]+/"
                                      r"providers/Microsoft\.OperationalInsights/"
                                      r"workspaces/[^/]+$")
    table: str = Field(default="ContainerLogV2", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    column: str = Field(default="LogMessage", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


def this_month(today: date | None = None) -> date:
    """The first day of the current month (UTC): where a new budget starts."""
    today = today or datetime.now(UTC).date()
    return today.replace(day=1)


class AzureEnvironment(Common):
    cloud: ClassVar[str] = "azure"
    webhook_source: ClassVar[str] = "key_vault"
    subscription: str = Field(
        pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    region: str = Field(pattern=r"^[a-z0-9]+$")
    resource_group: str | None = None  # default: trainguard-<name>
    ml_workspace: MlWorkspace
    log_query: LogQuery | None = None  # None: no query alerts (compute clusters)
    #: the budgets' first month; default the current month at synth. Azure takes the
    #: first of a month, not before the current one; the stack ignores later drift
    budget_start: date | None = Field(default=None,
                                      description="first day of the budgets' first month")
    log_retention_days: int = Field(default=30, ge=30, le=730)

    @field_validator("budget_start", mode="before")
    @classmethod
    def _date(cls, v: Any) -> Any:
        return date.fromisoformat(v) if isinstance(v, str) else v

    @field_validator("budget_start")
    @classmethod
    def _first(cls, v: date | None) -> date | None:
        if v is None:
            return v
        if v.day != 1:
            raise ValueError("Azure budgets start on the first day of a month")
        if v < this_month():
            raise ValueError(f"{v.isoformat()} is a past month: Azure rejects a budget "
                             f"starting before the current month ({this_month().isoformat()});"
                             " leave budget_start out to start this month")
        return v

    @property
    def budget_start_date(self) -> date:
        return self.budget_start or this_month()

    @property
    def group(self) -> str:
        return self.resource_group or f"trainguard-{self.name}"


#: the label OpenShift Logging's documentation selects alerting rules by, on the rules
#: and on their namespaces (LokiStack spec.rules.selector and namespaceSelector)
LOG_ALERTING_LABEL = {"openshift.io/log-alerting": "true"}


class LokiStack(BaseModel):
    """The LokiStack the logs go to. Its ruler loads an AlertingRule only when the rule's
    labels match ``spec.rules.selector`` and its namespace's labels match
    ``spec.rules.namespaceSelector``: say here what the LokiStack selects by
    (``trainguard preflight`` reads the LokiStack and compares)."""

    model_config = _STRICT
    name: str = "logging-loki"
    namespace: str = "openshift-logging"
    rule_labels: dict[str, str] = Field(default_factory=lambda: dict(LOG_ALERTING_LABEL),
                                        min_length=1)
    namespace_labels: dict[str, str] = Field(
        default_factory=lambda: dict(LOG_ALERTING_LABEL), min_length=1)


class FluentBitOutput(BaseModel):
    """Where Fluent Bit sends the lines that match a signature (a Loki push endpoint)."""

    model_config = _STRICT
    host: str = Field(min_length=1)
    port: int = Field(default=3100, ge=1, le=65535)
    tls: bool = True
    # The Fluent Bit image by digest (it reads every container's logs on every node): the
    # chart's default is a tag, which can be moved to another image.
    image: str = Field(pattern=r"^[^\s@:]+(:[0-9]+)?(/[^\s@:]+)*@sha256:[0-9a-f]{64}$")


class Smtp(BaseModel):
    model_config = _STRICT
    smarthost: str = Field(pattern=r"^[^\s:]+:\d+$")
    sender: Email


class StateVolume(BaseModel):
    """The PersistentVolumeClaim holding the SQLite state (``state: sqlite``)."""

    model_config = _STRICT
    size: str = Field(default="1Gi", pattern=r"^[1-9][0-9]*(Mi|Gi)$")
    storage_class: str | None = None  # default: the cluster's default class


class OpenshiftEnvironment(Common):
    cloud: ClassVar[str] = "openshift"
    webhook_source: ClassVar[str] = "secret"
    cluster: K8sName
    kube_context: str | None = None  # default: the kubeconfig's current context
    namespace: K8sName = "trainguard"
    watch_namespaces: list[K8sName] = Field(min_length=1)
    # By digest only: a tag can be moved to another image after review (issue 16).
    image: str = Field(pattern=r"^[^\s@]+@sha256:[0-9a-f]{64}$")
    log_shipping: Literal["loki", "fluentbit"] = "loki"
    lokistack: LokiStack = Field(default_factory=LokiStack)
    fluentbit: FluentBitOutput | None = None
    smtp: Smtp | None = None
    prometheus_url: str = "https://thanos-querier.openshift-monitoring.svc:9091"
    #: true when prometheus_url is the querier's namespaced (tenancy) port, 9092: every
    #: query then names the job's namespace and the querier enforces it
    prometheus_tenancy: bool = False
    alertmanager_url: str = (
        "https://alertmanager-user-workload.openshift-user-workload-monitoring.svc:9095")
    pushgateway_url: str | None = None
    console_url: str | None = Field(default=None, pattern=r"^https://[^\s]+$")
    #: how a stop is made: suspend the job (patch) or delete it (delete); each grants
    #: only its own verb, and only with stop_enabled
    stop_mode: Literal["suspend", "delete"] = "suspend"
    remind_every_minutes: int = Field(default=360, ge=5, le=7 * 24 * 60)
    #: a ValidatingAdmissionPolicy limiting the watchdog's patches to suspend and its
    #: stop annotation (stacks/admission.py; Kubernetes 1.30+ / OpenShift 4.17+)
    admission_policy: bool = False
    state: Literal["configmap", "sqlite"] = "configmap"
    state_volume: StateVolume = Field(default_factory=StateVolume)
    #: the Grafana dashboard in the OpenShift console (Observe > Dashboards)
    console_dashboard: bool = True
    #: labels of the grafana-operator's Grafana instances that import the dashboard (a
    #: GrafanaDashboard); none: no GrafanaDashboard (it needs the operator's CRD)
    grafana_instance_labels: dict[str, str] | None = None


#: cloud name -> its environment model
CLOUDS: dict[str, type[Common]] = {
    m.cloud: m for m in (AwsEnvironment, AzureEnvironment, OpenshiftEnvironment)}


# ---------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class Environment:
    path: Path
    spec: Common
    policy: Policy
    policy_path: Path

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def cloud(self) -> str:
        return self.spec.cloud


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _cross_checks(spec: Common, path: Path, lines: dict[Loc, int], filename: str
                  ) -> list[Problem]:
    out: list[Problem] = []

    def problem(loc: Loc, reason: str) -> None:
        out.append(Problem(filename, line_of(loc, lines), dotted(loc), reason))

    if spec.name != path.stem:
        problem(("name",), f"must equal the file name '{path.stem}' "
                           f"(cdktn deploy {path.stem} builds this file)")
    if isinstance(spec, OpenshiftEnvironment):
        try:
            spec.tick.standard_cron()
        except ValueError as e:
            problem(("schedule",), str(e))
        if spec.log_shipping == "fluentbit" and spec.fluentbit is None:
            problem(("log_shipping",), "fluentbit needs a 'fluentbit: {host: ...}' section "
                                       "(where the matched lines go)")
    if isinstance(spec, AzureEnvironment):
        try:
            spec.tick.standard_cron()
        except ValueError as e:
            problem(("schedule",), str(e))
    try:
        spec.tick.interval_minutes()
    except ValueError as e:
        problem(("schedule",), str(e))
    return out


#: a Kubernetes label (or annotation) key: an optional DNS subdomain prefix and a name
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
#: the policy's default protect tag; the Kubeflow adapter reads the label
#: ``trainguard.io/protect`` as this tag (Kubernetes keys cannot hold ':')
DEFAULT_PROTECT_TAG = "trainguard:protect"


def label_safe(key: str) -> bool:
    prefix, _, _ = key.rpartition("/")
    return bool(_LABEL_KEY.match(key)) and len(prefix) <= 253


def _policy_checks(spec: Common, policy: Policy, lines: dict[Loc, int], filename: str
                   ) -> list[Problem]:
    """What the environment needs of its policy."""
    tag = policy.safety.protect_tag
    if isinstance(spec, OpenshiftEnvironment) and tag != DEFAULT_PROTECT_TAG \
            and not label_safe(tag):
        return [Problem(filename, line_of(("policy",), lines), "policy",
                        f"{spec.policy}: safety.protect_tag {tag!r} cannot be a Kubernetes "
                        f"label key, so no job could carry it: use a label key such as "
                        f"'example.com/protect', or the default {DEFAULT_PROTECT_TAG!r} "
                        "(set as the label trainguard.io/protect)")]
    return []


def load_environment(path: str | Path, root: Path = ROOT) -> Environment:
    """Read and validate one environment file and its policy, or raise
    ``EnvironmentFileError`` listing every problem with its file, line and field."""
    path = Path(path)
    filename = _display(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise EnvironmentFileError([Problem(filename, None, "", "cannot read the environment "
                                         f"file: {e.strerror or e}")]) from None
    try:
        data, lines = load_yaml(text, filename)
    except PolicyError as e:
        raise EnvironmentFileError(e.problems) from None
    if not isinstance(data, dict):
        raise EnvironmentFileError([Problem(filename, lines.get(()), "", "an environment is a "
                                         "mapping (name:, cloud:, ...)")])
    cloud = data.get("cloud")
    model = CLOUDS.get(cloud) if isinstance(cloud, str) else None
    if model is None:
        raise EnvironmentFileError([Problem(
            filename, line_of(("cloud",), lines), "cloud",
            f"expected one of {', '.join(sorted(CLOUDS))}, got {cloud!r}")])
    body = {k: v for k, v in data.items() if k != "cloud"}
    try:
        spec = model.model_validate(body)
    except ValidationError as e:
        raise EnvironmentFileError(validation_problems(e, model, (), filename, lines)) from None
    problems = _cross_checks(spec, path, lines, filename)
    policy_path = (root / spec.policy).resolve()
    policy: Policy | None = None
    if not policy_path.is_relative_to(root.resolve()):
        problems.append(Problem(filename, line_of(("policy",), lines), "policy",
                                "must be a file inside the repository (it is packaged)"))
    elif not policy_path.is_file():
        problems.append(Problem(filename, line_of(("policy",), lines), "policy",
                                f"no such file: {spec.policy} (relative to the repository)"))
    else:
        try:
            policy = load_policy(policy_path)
        except PolicyError as e:
            problems.append(Problem(filename, line_of(("policy",), lines), "policy",
                                    f"{spec.policy} is not a valid policy (below)"))
            problems.extend(Problem(_display(Path(p.file)), p.line, p.field, p.reason)
                            for p in e.problems)
    if policy is not None:
        problems.extend(_policy_checks(spec, policy, lines, filename))
    if problems or policy is None:
        raise EnvironmentFileError(problems)
    return Environment(path=path, spec=spec, policy=policy, policy_path=policy_path)


def load_all(folder: Path = ENVIRONMENTS) -> list[Environment]:
    """Every ``*.yaml`` in ``folder``, sorted by name; all files' problems at once."""
    envs: list[Environment] = []
    problems: list[Problem] = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            envs.append(load_environment(path))
        except EnvironmentFileError as e:
            problems.extend(e.problems)
    if problems:
        raise EnvironmentFileError(problems)
    if not envs:
        raise EnvironmentFileError([Problem(_display(folder), None, "", "no environment files "
                                         "(*.yaml) to synthesise")])
    return envs
