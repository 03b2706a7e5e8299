"""Checks every test applies to an MPIJob manifest: the v2beta1 rules and the real Kubernetes schemas."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from pgtrain.launch.mpijob import validation

KUBERNETES_VERSION = "1.30.0"


def assert_valid_mpijob(manifest: dict[str, Any]) -> None:
    """pgtrain's and the MPI Operator's rules, and both pod templates against the Kubernetes schemas."""
    assert list(validation.mpijob_problems(manifest)) == []
    for role, replica in manifest["spec"]["mpiReplicaSpecs"].items():
        template = replica["template"]
        resource = {"apiVersion": "v1", "kind": "PodTemplate",
                    "metadata": {"name": f"{manifest['metadata']['name']}-{role.lower()}"}, "template": template}
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        # the MPI Operator sets the pods' restartPolicy from the replica's, with a warning event for one in a template
        assert "restartPolicy" not in template["spec"]
        assert "activeDeadlineSeconds" not in template["spec"]  # the job's deadline is in runPolicy


def assert_cluster_accepted_every_manifest(cluster: Any, namespace: str) -> None:
    """Every MPIJob the operator sent to the simulated cluster was valid, and its controller agreed."""
    created = cluster.history(namespace, verb="create", resource="mpijobs")
    assert created
    for entry in created:
        assert_valid_mpijob(entry["body"])
    assert not cluster.history(namespace, verb="event", reason="ValidationError")
