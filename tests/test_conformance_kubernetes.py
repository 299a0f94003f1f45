"""Every Kubernetes object the OpenShift stack emits, validated against the schema the
API server would apply: the built-in kinds against the Kubernetes OpenAPI schemas
(``kubernetes-validate``, strict: an unknown field is an error, as with ``kubectl
--validate=strict``), the custom resources against their CRDs' published schemas
(vendored in tests/reference/crds, each naming its repository, path and commit).

No API server runs here, so this is the boundary the tests stand on; the schemas are the
services' own. Typed Terraform resources (``kubernetes_cron_job_v1`` ...) are turned back
into the object the provider sends (snake_case to camelCase, blocks to lists or objects
as the Kubernetes type has them)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.test_real_services import REFERENCE

pytestmark = pytest.mark.slow

Stack = dict[str, Any]
KUBERNETES = "1.30.0"  # OpenShift 4.17; the admission policy needs 1.30+ (stacks/admission.py)
CRDS = REFERENCE / "crds"

#: typed Terraform resource -> (apiVersion, kind)
TYPED = {
    "kubernetes_namespace_v1": ("v1", "Namespace"),
    "kubernetes_service_account_v1": ("v1", "ServiceAccount"),
    "kubernetes_config_map_v1": ("v1", "ConfigMap"),
    "kubernetes_persistent_volume_claim_v1": ("v1", "PersistentVolumeClaim"),
    "kubernetes_role_v1": ("rbac.authorization.k8s.io/v1", "Role"),
    "kubernetes_role_binding_v1": ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    "kubernetes_cluster_role_binding_v1": ("rbac.authorization.k8s.io/v1",
                                           "ClusterRoleBinding"),
    "kubernetes_cron_job_v1": ("batch/v1", "CronJob"),
}
#: the provider's block names whose Kubernetes field is a list under another name
LISTS = {"container": "containers", "init_container": "initContainers", "volume": "volumes",
         "volume_mount": "volumeMounts", "rule": "rules", "subject": "subjects",
         "env": "env", "port": "ports", "toleration": "tolerations"}
#: fields the provider takes as strings that Kubernetes types as integers
INTEGERS = {"ttlSecondsAfterFinished"}
#: the provider's own settings, not part of the object
TERRAFORM_ONLY = {"//", "depends_on", "lifecycle", "provider", "wait_until_bound",
                  "field_manager", "count", "for_each"}
#: a Terraform reference stands for a value known at apply time
REFERENCE_VALUE = re.compile(r"^\$\{.+\}$")


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def to_object(value: Any) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, v in value.items():
            if key in TERRAFORM_ONLY:
                continue
            if key in LISTS:
                out[LISTS[key]] = [to_object(x) for x in v]
                continue
            if isinstance(v, list) and len(v) == 1 and isinstance(v[0], dict):
                v = v[0]  # a block of at most one, an object in Kubernetes
            name = camel(key)
            v = to_object(v)
            if name in INTEGERS and isinstance(v, str) and v.isdigit():
                v = int(v)
            out[name] = v
        return out
    if isinstance(value, list):
        return [to_object(x) for x in value]
    if isinstance(value, str) and REFERENCE_VALUE.match(value):
        return "trainguard"  # every reference here is a name
    return value


def objects(stack: Stack) -> list[tuple[str, dict[str, Any]]]:
    """(Terraform address, Kubernetes object) of everything the stack creates."""
    out = []
    for rtype, (api, kind) in TYPED.items():
        for rid, res in stack["resource"].get(rtype, {}).items():
            obj = {"apiVersion": api, "kind": kind, **to_object(res)}
            out.append((f"{rtype}.{rid}", obj))
    for rid, res in stack["resource"].get("kubernetes_manifest", {}).items():
        out.append((f"kubernetes_manifest.{rid}", res["manifest"]))
    return out


def strict(schema: Any) -> Any:
    """A CRD schema as ``kubectl --validate=strict`` applies it: an object that names its
    properties takes no others (unless it says it keeps unknown fields)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(x) for x in schema]
    return schema


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in sorted(CRDS.glob("*.json")):
        doc = json.loads(path.read_text())
        out[(f"{doc['group']}/{doc['version']}", doc["kind"])] = strict(doc["schema"])
    return out


def validate_crd(obj: dict[str, Any], schemas: dict[tuple[str, str], dict[str, Any]]
                 ) -> None:
    schema = schemas[(obj["apiVersion"], obj["kind"])]
    body = copy.deepcopy(obj)
    body["metadata"] = {}  # metadata is the API server's ObjectMeta, checked below
    # no metaschema check: CRD patterns are Go RE2 (an inline (?i) mid-pattern), which the
    # metaschema's Python regex check refuses; the patterns of the fields used compile
    jsonschema.Draft7Validator(schema).validate(body)


def test_every_object_validates_against_its_schema(stacks: dict[str, Stack]) -> None:
    schemas = crd_schemas()
    seen_kinds = set()
    for address, obj in objects(stacks["openshift-onprem"]):
        seen_kinds.add(obj["kind"])
        key = (obj["apiVersion"], obj["kind"])
        try:
            if key in schemas:
                validate_crd(obj, schemas)
            else:
                kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as e:
            pytest.fail(f"{address} ({obj['kind']}): {e}")
        name = obj.get("metadata", {}).get("name", "")
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name), (address, name)
        for k, v in obj.get("metadata", {}).get("labels", {}).items():
            assert len(v) <= 63 and re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]?",
                                                v), (address, k, v)
    # every custom resource kind the stack uses has its CRD here
    used = {k for _, o in objects(stacks["openshift-onprem"])
            for k in [(o["apiVersion"], o["kind"])] if not k[0].startswith(
                ("v1", "batch/", "rbac.", "admissionregistration."))}
    assert used <= set(schemas), used - set(schemas)
    assert {"CronJob", "Role", "PodMonitor", "PrometheusRule", "AlertmanagerConfig",
            "ClusterLogForwarder", "AlertingRule"} <= seen_kinds


@pytest.mark.parametrize(("kind", "mutate", "error"), [
    ("PodMonitor", lambda s: s["podMetricsEndpoints"][0].update(prot="metrics"),
     "Additional properties"),
    ("PodMonitor", lambda s: s["podMetricsEndpoints"][0].update(interval="30 seconds"),
     "does not match"),
    ("PrometheusRule", lambda s: s["groups"][0]["rules"][0].pop("expr"), "'expr'"),
    ("AlertmanagerConfig", lambda s: s["route"].update(groupWait=30), "is not of type"),
    ("AlertingRule", lambda s: s["groups"][0].pop("name"), "'name' is a required"),
    ("AlertingRule", lambda s: s["groups"][0].update(interval=60), "is not of type"),
    ("ClusterLogForwarder", lambda s: s["outputs"][0].update(type="loki-stack"),
     "is not one of"),
])
def test_the_schemas_catch_a_mistake(stacks: dict[str, Stack], kind: str, mutate: Any,
                                     error: str) -> None:
    """The check can fail: one wrong field in an object the stack emits is refused."""
    schemas = crd_schemas()
    obj = copy.deepcopy(next(o for _, o in objects(stacks["openshift-onprem"])
                             if o["kind"] == kind))
    mutate(obj["spec"])
    with pytest.raises(jsonschema.ValidationError, match=re.escape(error)):
        validate_crd(obj, schemas)


def test_a_builtin_object_with_a_wrong_field_is_refused(stacks: dict[str, Stack]) -> None:
    obj = next(o for _, o in objects(stacks["openshift-onprem"]) if o["kind"] == "CronJob")
    bad = copy.deepcopy(obj)
    bad["spec"]["concurrencyPolicy"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)
    bad = copy.deepcopy(obj)
    bad["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["imagePullPolice"] \
        = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)


def test_lokistack_rules_selectors_are_the_crds_fields() -> None:
    """The LokiStack reference's spec.rules fields are those of the LokiStack CRD."""
    loki = yaml.safe_load((REFERENCE / "lokistack" / "lokistack-rules.yaml").read_text())
    doc = json.loads((CRDS / "lokistacks.loki.grafana.com.v1.json").read_text())
    jsonschema.Draft7Validator(strict(doc["schema"])).validate({"spec": loki["spec"]})
