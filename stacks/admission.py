"""An optional ValidatingAdmissionPolicy for OpenShift / Kubernetes (``admission_policy:
true`` in the environment): the watchdog's ServiceAccount may change a PyTorchJob or a
TrainJob only by suspending it and writing its stop annotation (docs/security.md).

RBAC can say "patch", not "patch only these fields": if the token leaked, it could
rewrite a job's image or command in every watched namespace. This policy (Kubernetes
1.30+, admissionregistration.k8s.io/v1) refuses any update by that ServiceAccount that
changes anything else the policy compares: labels, other annotations, the replica
specs and run policy of a PyTorchJob (all but ``suspend``), the runtime, trainer and
initializer of a TrainJob (all but ``suspend``).
"""

from __future__ import annotations

from typing import Any

from trainguard.adapters.kubeflow.kinds import STOP_REASON_ANNOTATION

NAME = "trainguard-watchdog-stops-only"

#: resource -> the spec fields the watchdog never changes, as CEL paths under ``spec``
UNCHANGED: dict[str, tuple[str, ...]] = {
    "pytorchjobs": ("pytorchReplicaSpecs", "elasticPolicy", "nprocPerNode",
                    "runPolicy.activeDeadlineSeconds", "runPolicy.backoffLimit",
                    "runPolicy.cleanPodPolicy", "runPolicy.schedulingPolicy",
                    "runPolicy.ttlSecondsAfterFinished"),
    "trainjobs": ("runtimeRef", "trainer", "initializer"),
}


def _same(path: str) -> str:
    """CEL: ``spec.PATH`` is present in both or neither, and equal where present."""
    new, old = f"object.spec.{path}", f"oldObject.spec.{path}"
    parent = path.rpartition(".")[0]
    guard = (f"has(object.spec.{parent}) && has(oldObject.spec.{parent}) && "
             if parent else "")
    inner = f"has({new}) == has({old}) && (!has({new}) || {new} == {old})"
    if not parent:
        return inner
    # a parent present on one side only is a change too
    return (f"(has(object.spec.{parent}) == has(oldObject.spec.{parent})) && "
            f"(!has(object.spec.{parent}) || ({guard}{inner}))")


def _annotations_only_stop_reason() -> str:
    key = STOP_REASON_ANNOTATION
    new, old = "object.metadata.annotations", "oldObject.metadata.annotations"
    return (f"(!has({new}) || {new}.all(k, k == '{key}' || (has({old}) && k in {old} && "
            f"{old}[k] == {new}[k]))) && (!has({old}) || {old}.all(k, k == '{key}' || "
            f"(has({new}) && k in {new})))")


def validations() -> list[dict[str, str]]:
    out = [
        {"expression": "has(object.metadata.labels) == has(oldObject.metadata.labels) && "
                       "(!has(object.metadata.labels) || "
                       "object.metadata.labels == oldObject.metadata.labels)",
         "message": "trainguard's ServiceAccount may not change a job's labels"},
        {"expression": _annotations_only_stop_reason(),
         "message": f"trainguard's ServiceAccount may only write the {STOP_REASON_ANNOTATION} "
                    "annotation"},
    ]
    for resource, paths in UNCHANGED.items():
        same = " && ".join(_same(p) for p in paths)
        out.append({"expression": f"request.resource.resource != '{resource}' || ({same})",
                    "message": f"trainguard's ServiceAccount may only suspend {resource}"})
    return out


def policy(service_account: str, namespace: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy's spec."""
    user = f"system:serviceaccount:{namespace}:{service_account}"
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [
            {"apiGroups": ["kubeflow.org"], "apiVersions": ["*"], "resources": ["pytorchjobs"],
             "operations": ["UPDATE"]},
            {"apiGroups": ["trainer.kubeflow.org"], "apiVersions": ["*"],
             "resources": ["trainjobs"], "operations": ["UPDATE"]}]},
        "matchConditions": [{"name": "trainguard-only",
                             "expression": f"request.userInfo.username == '{user}'"}],
        "validations": validations(),
    }


def binding(namespaces: list[str]) -> dict[str, Any]:
    """The binding's spec: the policy, denying, in the watched namespaces."""
    return {"policyName": NAME, "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In",
                 "values": sorted(namespaces)}]}}}
