"""Environment files: the samples load, and a file with mistakes fails with the file,
line, field and reason of each mistake (and a bad policy with the policy's own line)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.stacks.environment import (
    ROOT,
    AwsEnvironment,
    EnvironmentFileError,
    OpenshiftEnvironment,
    Schedule,
    load_all,
    load_environment,
)

AWS = """\
name: {name}
cloud: aws
account: "111122223333"
region: us-east-1
schedule: rate(5 minutes)
policy: policies/production-stops.yaml
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(EnvironmentFileError) as err:
        load_environment(path)
    return [str(p) for p in err.value.problems]


def test_the_sample_environments_load() -> None:
    envs = {e.name: e for e in load_all()}
    assert {"aws-dev", "azure-research", "openshift-onprem"} <= set(envs)
    aws = envs["aws-dev"].spec
    assert isinstance(aws, AwsEnvironment) and aws.stop_tag_value == "aws-dev"
    assert envs["aws-dev"].policy.name == "production-stops"
    assert envs["azure-research"].policy.safety.dry_run is True
    ocp = envs["openshift-onprem"].spec
    assert isinstance(ocp, OpenshiftEnvironment) and ocp.log_shipping == "loki"


def test_a_good_file_loads(tmp_path: Path) -> None:
    env = load_environment(write(tmp_path, "prod", AWS.format(name="prod")))
    assert env.cloud == "aws" and env.spec.tick.aws() == "rate(5 minutes)"
    assert env.policy_path == ROOT / "policies" / "production-stops.yaml"


def test_mistakes_name_file_line_field_and_reason(tmp_path: Path) -> None:
    text = AWS.format(name="other").replace('"111122223333"', "1111")
    text = text.replace("rate(5 minutes)", "every 5 minutes")
    text += "alarms:\n  emails: [not-an-email]\n  webhoks: []\nstop_enabled: yes please\n"
    got = problems(write(tmp_path, "prod", text))
    joined = "\n".join(got)
    assert f"{tmp_path}/prod.yaml:3: account: Input should be a valid string" in joined
    assert "prod.yaml:5: schedule: Value error, expected 'rate(N minutes)'" in joined
    assert "prod.yaml:8: alarms.emails[0]: String should match pattern" in joined
    assert "prod.yaml:9: alarms.webhoks: extra fields not permitted; did you mean " \
           "'webhooks'?" in joined
    assert "prod.yaml:10: stop_enabled: Input should be a valid boolean" in joined
    assert len(got) == 5  # every problem at once


def test_name_must_match_the_file(tmp_path: Path) -> None:
    (line,) = problems(write(tmp_path, "prod", AWS.format(name="staging")))
    assert line.endswith("prod.yaml:1: name: must equal the file name 'prod' "
                         "(cdktn deploy prod builds this file)")


def test_unknown_cloud(tmp_path: Path) -> None:
    text = AWS.format(name="prod").replace("cloud: aws", "cloud: gcp")
    (line,) = problems(write(tmp_path, "prod", text))
    assert line.endswith("prod.yaml:2: cloud: expected one of aws, azure, openshift, got 'gcp'")


def test_missing_policy_file(tmp_path: Path) -> None:
    text = AWS.format(name="prod").replace("production-stops", "nope")
    (line,) = problems(write(tmp_path, "prod", text))
    assert line.endswith("prod.yaml:6: policy: no such file: policies/nope.yaml "
                         "(relative to the repository)")


def test_a_bad_policy_fails_with_its_own_line(tmp_path: Path) -> None:
    policy = ROOT / "build" / "test-bad-policy.yaml"
    policy.parent.mkdir(exist_ok=True)
    policy.write_text("name: bad\nrules:\n  stall:\n    params: {min_secnds: 5}\n")
    try:
        text = AWS.format(name="prod").replace("policies/production-stops.yaml",
                                               "build/test-bad-policy.yaml")
        got = problems(write(tmp_path, "prod", text))
    finally:
        policy.unlink()
    assert got[0].endswith("prod.yaml:6: policy: build/test-bad-policy.yaml is not a valid "
                           "policy (below)")
    assert got[1].startswith("build/test-bad-policy.yaml:4: rules.stall.params.min_secnds: "
                             "extra fields not permitted; did you mean 'min_seconds'?")


def test_cloud_specific_checks(tmp_path: Path) -> None:
    text = """\
name: ocp
cloud: openshift
cluster: lab
watch_namespaces: []
image: quay.io/x/trainguard
schedule: rate(7 minutes)
policy: policies/research-team.yaml
log_shipping: fluentbit
"""
    got = "\n".join(problems(write(tmp_path, "ocp", text)))
    assert "ocp.yaml:4: watch_namespaces: List should have at least 1 item" in got
    assert "ocp.yaml:5: image: String should match pattern" in got
    # A tag is not enough either: an image by digest only (a tag can be moved).
    tagged = text.replace("trainguard\n", "trainguard:1.0\n")
    assert "ocp.yaml:5: image: String should match pattern" in "\n".join(
        problems(write(tmp_path, "ocp", tagged)))
    fixed = text.replace("[]", "[ml]").replace("trainguard\n", "trainguard@sha256:" + "ab" * 32
                                               + "\n")
    got = "\n".join(problems(write(tmp_path, "ocp", fixed)))
    assert "ocp.yaml:6: schedule: rate(7 minutes) has no cron form" in got
    assert "ocp.yaml:8: log_shipping: fluentbit needs a 'fluentbit: {host: ...}' section" in got


def test_yaml_syntax_error(tmp_path: Path) -> None:
    (line,) = problems(write(tmp_path, "prod", "name: prod\ncloud: [aws\n"))
    assert "prod.yaml:3: YAML syntax error" in line


@pytest.mark.parametrize(("text", "aws", "cron", "azure"), [
    ("rate(5 minutes)", "rate(5 minutes)", "*/5 * * * *", "0 */5 * * * *"),
    ("rate(1 minute)", "rate(1 minute)", "* * * * *", "0 * * * * *"),
    ("rate(2 hours)", "rate(2 hours)", "0 */2 * * *", "0 0 */2 * * *"),
    ("cron(0 9 * * 1-5)", "cron(0 9 ? * MON-FRI *)", "0 9 * * 1-5", "0 0 9 * * 1-5"),
    ("cron(*/10 * * * *)", "cron(*/10 * * * ? *)", "*/10 * * * *", "0 */10 * * * *"),
])
def test_schedule_forms(text: str, aws: str, cron: str, azure: str) -> None:
    s = Schedule.parse(text)
    assert (s.aws(), s.standard_cron(), s.ncrontab()) == (aws, cron, azure)


@pytest.mark.parametrize("text", ["rate(5 minute)", "rate(0 minutes)", "cron(* * * *)",
                                  "cron(a * * * *)", "hourly"])
def test_bad_schedules(text: str) -> None:
    with pytest.raises(ValueError):
        Schedule.parse(text)


def test_the_app_reports_problems_without_a_traceback(tmp_path: Path) -> None:
    """``python -m trainguard.stacks`` on a folder with a broken file: exit 2, a line each."""
    write(tmp_path, "prod", AWS.format(name="prod").replace("cloud: aws", "cloud: gcp"))
    env = {**os.environ, "TRAINGUARD_ENVIRONMENTS": str(tmp_path),
           "CDKTF_OUTDIR": str(tmp_path / "out"),
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    done = subprocess.run([sys.executable, "-m", "trainguard.stacks"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"trainguard: error: {tmp_path}/prod.yaml:2: cloud: expected one of aws, azure, "
        "openshift, got 'gcp'"]


@pytest.mark.parametrize(("cloud", "extra", "hook", "why"), [
    ("aws", 'account: "111122223333"\nregion: us-east-1\n',
     '{name: chat, url: "https://hooks.example.com/T0/B0/secret"}',
     "a webhook URL is a secret: never write it in the repository"),
    ("aws", 'account: "111122223333"\nregion: us-east-1\n',
     "{name: chat, secret: {name: hooks, key: chat}}",
     "on aws the URL comes from ssm_parameter"),
    ("openshift", "cluster: lab\nwatch_namespaces: [ml]\nimage: q/t@sha256:" + "ab" * 32 + "\n",
     "{name: chat, ssm_parameter: /tg/chat}", "on openshift the URL comes from secret"),
])
def test_a_webhook_url_never_lives_in_the_repository(tmp_path: Path, cloud: str, extra: str,
                                                     hook: str, why: str) -> None:
    text = (f"name: env\ncloud: {cloud}\n{extra}policy: policies/research-team.yaml\n"
            f"alarms:\n  webhooks:\n    - {hook}\n")
    got = "\n".join(problems(write(tmp_path, "env", text)))
    assert why in got and "env.yaml:" in got
