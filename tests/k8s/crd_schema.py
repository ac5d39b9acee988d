"""Offline validation of Kubeflow and KServe objects against their schemas at the pinned releases.

The schemas are upstream data in ``$DINOPS_SHARED_DIR/crds`` (default ``<repo>/../shared/crds``; its README names
each file's repository, tag and path): the OpenAPI v3 schemas of the TrainJob (Trainer v2.3.0), PyTorchJob
(Training Operator v1.9.4) and InferenceService (KServe v0.20.0) CRDs, and Katib v0.19.0's swagger definitions for
the Experiment (its CRD carries no schema: ``x-kubernetes-preserve-unknown-fields``; Katib validates in a webhook).

Strict as ``kubectl apply --validate=strict``: a field the schema does not name is an error. The Kubernetes
extensions a plain JSON-schema validator does not know are translated first
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema):
``x-kubernetes-preserve-unknown-fields`` keeps unknown fields, ``x-kubernetes-int-or-string`` accepts both,
``nullable`` accepts null, ``x-kubernetes-embedded-resource`` an object with apiVersion/kind/metadata, and the
``int32``/``int64`` formats become range checks. CEL rules (``x-kubernetes-validations``) and webhook rules are not
run here; the tests of each kind check the ones that matter to us.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CRDS = Path(os.environ.get("DINOPS_SHARED_DIR", REPO.parent / "shared")) / "crds"

# (apiVersion, kind) -> the CRD file of the pinned release (crds/README.md).
CRD_FILES = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer-v2.3.0-trainjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): "trainer-v2.3.0-clustertrainingruntimes.yaml",
    ("kubeflow.org/v1", "PyTorchJob"): "training-operator-v1.9.4-pytorchjobs.yaml",
    ("serving.kserve.io/v1beta1", "InferenceService"): "kserve-v0.20.0-inferenceservices.yaml",
}
KATIB_SWAGGER = "katib-v0.19.0-swagger.json"
KATIB_KINDS = {("kubeflow.org/v1beta1", "Experiment"): "v1beta1.Experiment"}
# A batch Job (a Katib trial on one GPU) is checked by kubernetes-validate at this version.
KUBERNETES_VERSION = "1.33"

requires_crds = pytest.mark.skipif(
    not CRDS.is_dir(), reason=f"CRD schemas not found at {CRDS} (set DINOPS_SHARED_DIR to the shared/ folder)"
)

# metadata of the object itself: the API server's ObjectMeta rules that bite a rendered manifest.
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
OBJECT_META = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": _DNS_SUBDOMAIN},
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {"type": "object"}},
    },
    "additionalProperties": False,
}
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _strict(node: Any) -> Any:
    """A copy of an OpenAPI v3 (structural) or v2 schema that a Draft 7 validator runs as the API server would."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    # "properties" and "definitions" map names to schemas; every other keyword holds a schema, a list or a value.
    maps = ("properties", "definitions", "patternProperties")
    out = {key: _strict(value) for key, value in node.items() if key != "default" and key not in maps}
    for key in maps:
        if isinstance(node.get(key), dict):
            out[key] = {name: _strict(sub) for name, sub in node[key].items()}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("x-kubernetes-embedded-resource"):
        props = out.setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
    preserve = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-embedded-resource")
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    if node.get("type") == "integer" and node.get("format") in _INT_RANGES:
        out["minimum"], out["maximum"] = _INT_RANGES[node["format"]]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _with_object_meta(schema: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(schema)
    schema.setdefault("properties", {})["metadata"] = OBJECT_META
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    return schema


@functools.cache
def _crd_validator(filename: str, version: str) -> jsonschema.Draft7Validator:
    crd = yaml.load((CRDS / filename).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            schema = _with_object_meta(_strict(served["schema"]["openAPIV3Schema"]))
            return jsonschema.Draft7Validator(schema)
    raise AssertionError(f"{filename} serves no version {version!r}")


# Katib's swagger refers to core types it does not define; the parts we render are checked on their own
# (trialSpec against its kind), the rest of them accept an object.
_EXTERNAL = {
    "v1.ObjectMeta": OBJECT_META,
    "v1.ListMeta": {"type": "object"},
    "v1.Time": {"type": "string"},
    "v1.unstructured.Unstructured": {"type": "object"},
    "v1.Container": {"type": "object"},
    "v1.HTTPGetAction": {"type": "object"},
}


@functools.cache
def _katib_validator(definition: str) -> jsonschema.Draft7Validator:
    swagger = json.loads((CRDS / KATIB_SWAGGER).read_text())
    definitions = {name: _strict(schema) for name, schema in swagger["definitions"].items()}
    for name, schema in _EXTERNAL.items():
        definitions.setdefault(name, schema)
    root = _with_object_meta(definitions[definition])
    root["definitions"] = definitions
    return jsonschema.Draft7Validator(root)


def _path(error: jsonschema.ValidationError) -> str:
    return "/".join(str(p) for p in error.absolute_path) or "(root)"


def _errors(validator: jsonschema.Draft7Validator, obj: dict[str, Any], where: str) -> list[str]:
    found = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{where}{_path(e)}: {e.message}" for e in found]


def _trial_spec_errors(obj: dict[str, Any]) -> list[str]:
    """A Katib trial template is unstructured in the swagger: validate it as the object it is."""
    source = (obj.get("spec") or {}).get("trialTemplate") or {}
    trial = source.get("trialSpec")
    if not isinstance(trial, dict):
        return []
    errors = validate(trial)
    return [f"spec/trialTemplate/trialSpec/{error}" for error in errors]


def validate(obj: dict[str, Any]) -> list[str]:
    """The schema errors of one rendered TrainJob, PyTorchJob, Experiment, InferenceService (or a trial's Job)."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key in CRD_FILES:
        version = str(key[0]).rsplit("/", 1)[1]
        return _errors(_crd_validator(CRD_FILES[key], version), obj, "")
    if key in KATIB_KINDS:
        return _errors(_katib_validator(KATIB_KINDS[key]), obj, "") + _trial_spec_errors(obj)
    if key == ("batch/v1", "Job"):
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return [f"{'/'.join(map(str, exc.absolute_path)) or '(root)'}: {exc.message}"]
        return []
    raise ValueError(f"no schema for {key[0]} {key[1]} (known: {sorted(k for _, k in [*CRD_FILES, *KATIB_KINDS])})")


def kinds_with_schemas() -> list[str]:
    return sorted({kind for _, kind in [*CRD_FILES, *KATIB_KINDS]})


def trial_parameter_references(text: str) -> set[str]:
    """The ``${trialParameters.<name>}`` names a Katib trial template uses (pkg/controller.v1beta1/consts)."""
    return set(re.findall(r"\$\{trialParameters\.([^}]+)\}", text))
