"""Test double handle: start the simulated cluster as a subprocess and talk to it."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

PACKAGE_PARENT = Path(__file__).resolve().parents[1]


class SimulatedCluster:
    """One simulated cluster (one node with ``gpus`` GPUs); ``kubeconfig`` points clients at it."""

    def __init__(self, state_dir: Path, *, gpus: int = 8, image_bin_dir: Path | None = None,
                 mpijob_crd: bool = True) -> None:
        self.state_dir = state_dir
        self.gpus = gpus
        self.mpijob_crd = mpijob_crd  # False: a cluster without the MPI Operator (no MPIJob CRD)
        self.image_bin_dir = image_bin_dir or Path(sys.executable).parent
        self.token = secrets.token_hex(16)
        self.kubeconfig = state_dir / "kubeconfig"
        self.url = ""
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> SimulatedCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_PARENT),
                                                                           os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "k8s_sim", "--state-dir", str(self.state_dir),
             "--image-bin-dir", str(self.image_bin_dir), "--gpus", str(self.gpus), "--token", self.token,
             *([] if self.mpijob_crd else ["--without-mpijob-crd"])],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"the simulated cluster did not start: {line}{self._process.stdout.read()}")
        self.url = line.split("listening on ")[1].strip()
        self.kubeconfig.write_text(yaml.safe_dump(self.kubeconfig_dict()))

    def stop(self) -> None:
        if self._process and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def kubeconfig_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": "k8s-sim",
            "clusters": [{"name": "k8s-sim", "cluster": {"server": self.url}}],
            "users": [{"name": "airflow", "user": {"token": self.token}}],
            "contexts": [{"name": "k8s-sim", "context": {"cluster": "k8s-sim", "user": "airflow"}}],
        }

    def connection_uri_env(self, conn_id: str = "kubernetes_default") -> dict[str, str]:
        """An Airflow Kubernetes connection (as ``AIRFLOW_CONN_...``) pointing at this cluster."""
        value = json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(self.kubeconfig)}})
        return {f"AIRFLOW_CONN_{conn_id.upper()}": value}

    # --- API access for assertions and setup ---

    def api(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: {exc.code} {exc.read().decode()}") from None

    def new_namespace(self) -> str:
        return f"t-{uuid.uuid4().hex[:10]}"

    def create_secret(self, namespace: str, name: str, data: dict[str, str]) -> None:
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        self.api("POST", f"/api/v1/namespaces/{namespace}/secrets",
                 {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded})

    def mpijobs(self, namespace: str) -> list[dict[str, Any]]:
        return self.api("GET", f"/apis/kubeflow.org/v2beta1/namespaces/{namespace}/mpijobs")["items"]

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        return self.api("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")["items"]

    def history(self, namespace: str | None = None, **match: Any) -> list[dict[str, Any]]:
        """The API calls and cluster actions so far (reads too: verb get or list, with their selectors)."""
        path = "/sim/history" + (f"?namespace={namespace}" if namespace is not None else "")
        return [h for h in self.api("GET", path) if all(h.get(k) == v for k, v in match.items())]

    def queue_jobs(self, namespace: str) -> None:
        """Kueue manages this namespace: an MPIJob created with a ``kueue.x-k8s.io/queue-name`` label is
        suspended (``runPolicy.suspend``) until ``admit``."""
        self.api("PUT", "/sim/queue", {"namespace": namespace})

    def admit(self, namespace: str, name: str) -> None:
        """What Kueue does when the job's queue has room: unsuspend it."""
        self.api("PATCH", f"/apis/kubeflow.org/v2beta1/namespaces/{namespace}/mpijobs/{name}",
                 {"spec": {"runPolicy": {"suspend": False}}})

    def set_gpus(self, gpus: int) -> None:
        self.api("PUT", "/sim/node", {"gpus": gpus})

    def set_pull_seconds(self, seconds: float) -> None:
        """A cold node: each image it has not pulled yet takes ``seconds`` to pull (the pod waits in
        ContainerCreating, with Pulling and Pulled events)."""
        self.api("PUT", "/sim/node", {"pull_seconds": seconds})

    def log_text(self, namespace: str, pod_name: str) -> str:
        path = self.state_dir / "logs" / namespace / f"{pod_name}.log"
        return path.read_text() if path.exists() else ""

    def ssh_logins(self, host: str) -> list[str]:
        """The commands the worker named ``host`` (its hostfile name) took over ssh (tests/k8s_sim/sshd.py)."""
        path = self.state_dir / "sshd" / f"{host}.log"
        return [line.removeprefix("login: ") for line in path.read_text().splitlines()] if path.exists() else []

    @staticmethod
    def wait_for(predicate: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
        from tests.support import wait_for

        return wait_for(predicate, timeout, what)
