"""The offline schema check itself (crd_schema.py) can fail: each kind's minimal object passes, mistakes do not."""

from __future__ import annotations

import copy

import pytest
from k8s.crd_schema import CRDS, kinds_with_schemas, requires_crds, trial_parameter_references, validate

pytestmark = requires_crds

CONTAINER = {"name": "node", "image": "dinops-train:0.1.0", "command": ["tini", "--", "torchrun"]}
MINIMAL = {
    # trainer v2.3.0 examples/yaml/01-multi-node.yaml, reduced
    "TrainJob": {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "dinops-train", "namespace": "dinops"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"image": "dinops-train:0.1.0", "numNodes": 2, "resourcesPerNode": {"limits": {"cpu": "2"}}},
        },
    },
    # trainer release-1.9 examples/pytorch/simple.yaml, reduced
    "PyTorchJob": {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "dinops-train"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": {"containers": [{**CONTAINER, "name": "pytorch"}]}},
                }
            }
        },
    },
    # kserve v0.20.0 docs/samples/v1beta1/custom/custom_model/custom.yaml, reduced
    "InferenceService": {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "dinops"},
        "spec": {"predictor": {"containers": [{"name": "kserve-container", "image": "dinops-serve:0.1.0"}]}},
    },
    "Experiment": {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "Experiment",
        "metadata": {"name": "dinops-hpo"},
        "spec": {
            "objective": {"type": "maximize", "objectiveMetricName": "bbox_ap"},
            "algorithm": {"algorithmName": "random"},
            "maxTrialCount": 20,
            "parameters": [
                {"name": "lr", "parameterType": "double", "feasibleSpace": {"min": "0.00001", "max": "0.001"}}
            ],
            "trialTemplate": {
                "primaryContainerName": "train",
                "trialParameters": [{"name": "learningRate", "reference": "lr"}],
                "trialSpec": {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "spec": {
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [
                                    {
                                        **CONTAINER,
                                        "name": "train",
                                        "env": [{"name": "DINO_LR", "value": "${trialParameters.learningRate}"}],
                                    }
                                ],
                            }
                        }
                    },
                },
            },
        },
    },
}


def test_every_kind_with_a_schema_has_a_minimal_example():
    assert sorted(MINIMAL) == [k for k in kinds_with_schemas() if k != "ClusterTrainingRuntime"]


@pytest.mark.parametrize("kind", sorted(MINIMAL))
def test_the_minimal_object_of_each_kind_is_valid(kind):
    assert validate(MINIMAL[kind]) == []


@pytest.mark.parametrize("kind", sorted(MINIMAL))
def test_an_unknown_field_in_the_spec_is_rejected(kind):
    obj = copy.deepcopy(MINIMAL[kind])
    obj["spec"]["replica"] = 2
    assert any("'replica' was unexpected" in e for e in validate(obj)), validate(obj)


def test_mistakes_deep_inside_are_found():
    job = copy.deepcopy(MINIMAL["TrainJob"])
    job["spec"]["trainer"]["numNodes"] = "2"
    job["spec"]["trainer"]["resourcesPerNode"]["limit"] = {}
    errors = validate(job)
    assert any(e.startswith("spec/trainer/numNodes:") for e in errors)
    assert any("'limit' was unexpected" in e for e in errors)
    isvc = copy.deepcopy(MINIMAL["InferenceService"])
    isvc["spec"]["predictor"]["containers"][0]["port"] = 8080
    assert any("'port' was unexpected" in e for e in validate(isvc))


def test_int_or_string_and_int32_ranges():
    job = copy.deepcopy(MINIMAL["PyTorchJob"])
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    container["ports"] = [{"containerPort": 23456}]
    container["readinessProbe"] = {"httpGet": {"path": "/", "port": "http"}}
    assert validate(job) == []
    container["ports"] = [{"containerPort": 2**31}]
    assert any("containerPort" in e for e in validate(job))


def test_object_metadata_is_checked():
    job = copy.deepcopy(MINIMAL["TrainJob"])
    job["metadata"]["name"] = "Dinops_Train"
    job["metadata"]["label"] = {}
    errors = validate(job)
    assert any(e.startswith("metadata/name:") for e in errors) and any("'label' was unexpected" in e for e in errors)


def test_the_katib_trial_spec_is_validated_as_its_own_kind():
    exp = copy.deepcopy(MINIMAL["Experiment"])
    exp["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]["containers"][0]["envs"] = []
    assert any(e.startswith("spec/trialTemplate/trialSpec/") for e in validate(exp))
    exp = copy.deepcopy(MINIMAL["Experiment"])
    exp["spec"]["parameters"][0]["feasibleSpace"]["min"] = 0.00001  # Katib's feasible space holds strings
    assert any("feasibleSpace/min" in e for e in validate(exp))


def test_trial_parameter_references_are_read():
    assert trial_parameter_references('{"v": "${trialParameters.learningRate}/${trialParameters.wd}"}') == {
        "learningRate",
        "wd",
    }


def test_an_object_without_a_schema_is_refused():
    with pytest.raises(ValueError, match="no schema for v1 Pod"):
        validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}})


def test_the_schemas_are_the_pinned_releases():
    assert (CRDS / "README.md").read_text().count("v2.3.0") >= 3
