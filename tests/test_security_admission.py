"""The optional ValidatingAdmissionPolicy (issue 16, finding 4): with it, the watchdog's
ServiceAccount token, even leaked, can only suspend a job and write its stop annotation.

No API server runs here, so the policy's CEL expressions are evaluated with cel-python
(a pure-Python implementation of the CEL spec) on the objects an update would carry: the
watchdog's own suspend patch (admitted), and the attacks a leaked token would try
(denied). ``request.resource.resource`` is given as the API server gives it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.k8s_replay import RECORDINGS
from trainguard.adapters.kubeflow.kinds import KINDS, STOP_REASON_ANNOTATION
from trainguard.stacks import admission

celpy = pytest.importorskip("celpy", reason="cel-python is not installed (pip install "
                                            "-e .[dev])")

SA = "system:serviceaccount:trainguard:trainguard"


def admits(resource: str, old: dict[str, Any], new: dict[str, Any],
           user: str = SA) -> list[str]:
    """The messages of the validations the update fails ([] : admitted)."""
    env = celpy.Environment()
    spec = admission.policy("trainguard", "trainguard")
    activation = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
                  "request": celpy.json_to_cel({
                      "userInfo": {"username": user}, "operation": "UPDATE",
                      "resource": {"resource": resource}})}
    (match,) = spec["matchConditions"]
    if not env.program(env.compile(match["expression"])).evaluate(activation):
        return []  # not the watchdog: the policy does not apply
    return [v["message"] for v in spec["validations"]
            if not env.program(env.compile(v["expression"])).evaluate(activation)]


def merge(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386), as the API server applies the watchdog's."""
    out = copy.deepcopy(doc)
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


@pytest.fixture
def ptj() -> dict[str, Any]:
    job: dict[str, Any] = json.loads(
        (RECORDINGS / "pytorchjobs-ml-team.json").read_text())["items"][0]
    return job


def test_the_watchdogs_own_suspend_is_admitted(ptj: dict[str, Any]) -> None:
    patched = merge(ptj, KINDS["pytorchjob"].suspend_patch("divergence (critical)"))
    assert patched["spec"]["runPolicy"]["suspend"] is True
    assert admits("pytorchjobs", ptj, patched) == []


@pytest.mark.parametrize(("change", "why"), [
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     .update(image="evil.example/miner:latest"), "may only suspend pytorchjobs"),
    (lambda j: j["spec"]["runPolicy"].update(backoffLimit=1000), "may only suspend pytorchjobs"),
    (lambda j: j["metadata"].setdefault("labels", {}).update(
        {"trainguard.io/protect": "false"}), "labels"),
    (lambda j: j["metadata"].setdefault("annotations", {}).update(owner="mallory"),
     STOP_REASON_ANNOTATION),
])
def test_anything_else_a_leaked_token_tries_is_denied(ptj: dict[str, Any], change: Any,
                                                      why: str) -> None:
    attacked = copy.deepcopy(ptj)
    change(attacked)
    denied = admits("pytorchjobs", ptj, attacked)
    assert denied and any(why in m for m in denied)


def test_other_users_are_not_limited(ptj: dict[str, Any]) -> None:
    changed = copy.deepcopy(ptj)
    changed["spec"]["runPolicy"]["backoffLimit"] = 7
    assert admits("pytorchjobs", ptj, changed, user="system:serviceaccount:ml:owner") == []


def test_fluent_bit_runs_by_digest() -> None:
    """The log shipper reads every container's logs on every node: its image, like the
    watchdog's, is pinned by digest (a tag can be moved)."""
    from tests.test_seams import synth_openshift
    from trainguard.stacks.environment import FluentBitOutput

    digest = "sha256:" + "cd" * 32
    stack = synth_openshift(log_shipping="fluentbit", fluentbit=FluentBitOutput(
        host="loki.example", image=f"cr.fluentbit.io/fluent/fluent-bit@{digest}"))
    (release,) = stack["resource"]["helm_release"].values()
    values = json.loads(release["values"][0])
    assert values["image"] == {"repository": "cr.fluentbit.io/fluent/fluent-bit",
                               "digest": digest}
    with pytest.raises(ValueError, match="image"):
        FluentBitOutput(host="loki.example", image="cr.fluentbit.io/fluent/fluent-bit:3.2")
