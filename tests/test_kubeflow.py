"""The multi-node example (deploy/kubeflow/trainjob.yaml) against the vendored Kubeflow Trainer TrainJob
CRD, offline: every field known to the schema (unknown ones rejected), every value of the right type."""

import copy

import jsonschema
import pytest
import yaml

from helpers import REPO

KUBEFLOW = REPO / "deploy" / "kubeflow"


def strict(schema: dict) -> dict:
    """The CRD's structural schema, with unknown fields rejected wherever it lists the known ones (the
    API server prunes them silently; a typo would vanish without an error)."""
    schema = copy.deepcopy(schema)

    def walk(node: dict) -> None:
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        for sub in node.get("properties", {}).values():
            walk(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])
        for sub in (*node.get("allOf", ()), *node.get("anyOf", ()), *node.get("oneOf", ())):
            walk(sub)

    walk(schema)
    return schema


@pytest.fixture(scope="module")
def trainjob_schema() -> dict:
    crd = next(d for d in yaml.safe_load_all((KUBEFLOW / "crds" / "trainer.kubeflow.org_trainjobs.yaml").read_text()) if d)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return strict(version["schema"]["openAPIV3Schema"])


def test_the_trainjob_example_validates_against_the_crd(trainjob_schema):
    job = yaml.safe_load((KUBEFLOW / "trainjob.yaml").read_text())
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    jsonschema.validate(job, trainjob_schema)
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] * trainer["numProcPerNode"] == 16
    assert "torchrun --no-python grpo-sentinel train" in trainer["args"][0]
    assert {e["name"] for e in trainer["env"] if "valueFrom" in e} == {"LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY"}


def test_the_validation_would_catch_a_misspelt_field(trainjob_schema):
    job = yaml.safe_load((KUBEFLOW / "trainjob.yaml").read_text())
    job["spec"]["trainer"]["numProcsPerNode"] = job["spec"]["trainer"].pop("numProcPerNode")
    with pytest.raises(jsonschema.ValidationError, match="numProcsPerNode"):
        jsonschema.validate(job, trainjob_schema)
    job = yaml.safe_load((KUBEFLOW / "trainjob.yaml").read_text())
    job["spec"]["trainer"]["numNodes"] = "two"
    with pytest.raises(jsonschema.ValidationError, match="'two' is not of type 'integer'"):
        jsonschema.validate(job, trainjob_schema)
