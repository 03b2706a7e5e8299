"""Test double: a simulated Kubernetes cluster with a simulated MPI Operator, for tests only.

No cluster or container engine exists on the machines that run these tests. This package stands
in for one: an HTTP server speaking the part of the Kubernetes API that pgtrain's operator and
the cncf-kubernetes provider's hooks use, and a control loop that plays the MPI Operator,
kube-scheduler and the kubelet, running the launcher's rendered command as real local processes.
Tests point the real operator at it through an ordinary kubeconfig.
"""

from .cluster import SimulatedCluster

__all__ = ["SimulatedCluster"]
