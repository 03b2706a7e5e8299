"""Fixtures of the tests against the simulated Kubernetes cluster (tests/k8s_sim, a test double): one cluster per
session, a namespace per test holding the Secret with the test's database URL (PostgreSQL from tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.k8s_sim import SimulatedCluster
from tests.support import with_password


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatedCluster]:
    """One simulated cluster (one node, 8 GPUs) for the session; each test uses its own namespace."""
    with SimulatedCluster(tmp_path_factory.mktemp("k8s-sim"), gpus=8) as cluster:
        yield cluster


@pytest.fixture
def k8s(k8s_cluster: SimulatedCluster, monkeypatch: pytest.MonkeyPatch) -> SimulatedCluster:
    """The cluster, reachable through the Airflow connection ``kubernetes_default``."""
    for name, value in k8s_cluster.connection_uri_env().items():
        monkeypatch.setenv(name, value)
    return k8s_cluster


@pytest.fixture
def password_sentinel() -> str:
    """A password no output may ever contain (the embedded PostgreSQL trusts local connections)."""
    return f"pw-sentinel-{uuid.uuid4().hex}"


@pytest.fixture
def namespace(k8s: SimulatedCluster, db_url: str, password_sentinel: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A namespace holding the Secret with the database URL; the Airflow side gets it as pgtrain_db."""
    url = with_password(db_url, password_sentinel)
    ns = k8s.new_namespace()
    k8s.create_secret(ns, "pgtrain-db", {"url": url})
    monkeypatch.setenv("AIRFLOW_CONN_PGTRAIN_DB", url)
    return ns
