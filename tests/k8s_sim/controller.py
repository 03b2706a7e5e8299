"""Test double: the simulated cluster's control loop: an MPI Operator, a GPU scheduler and a kubelet.

- MPI Operator (kubeflow.org/v2beta1, as in mpi-operator v0.6): for each MPIJob, worker pods
  ``<job>-worker-<i>``; with ``launcherCreationPolicy: WaitForWorkersReady`` the launcher pod once
  all workers are ready; the hostfile at ``/etc/mpi/hostfile``; conditions Created, Running,
  Succeeded or Failed (reason and message as the real operator writes them); ``backoffLimit``,
  ``activeDeadlineSeconds``, ``ttlSecondsAfterFinished``, ``cleanPodPolicy``; foreground deletion;
  ``runPolicy.suspend`` (as Kueue sets it while a job waits in its queue): no pods, condition Suspended True
  (MPIJobSuspended) and Running False; unsuspended: Suspended False (MPIJobResumed), a new startTime, pods.
- Scheduler: one node with a fixed number of ``nvidia.com/gpu``; a pod that does not fit stays
  Pending with ``PodScheduled=False, Unschedulable`` as kube-scheduler reports it.
- Kubelet: env from ``value``, ``secretKeyRef`` and ``envFrom.secretRef`` (a missing Secret gives
  ``CreateContainerConfigError``); ``secret`` volumes written as files (``items``, ``defaultMode``) into a
  per-pod directory the container's paths are mapped to (a missing Secret or key leaves the pod in
  ContainerCreating with a ``FailedMount`` event, as the real kubelet does); the launcher's command
  runs as real local processes with the
  "image" mapped to a local bin directory (the project's virtualenv) and ``/etc/mpi`` mapped to a
  local directory holding the hostfile. A launcher running ``mpirun`` (the torch backend) gets the MPI Operator's
  hostfile (one ``<job>-worker-<i>.<job>-worker.<ns>.svc slots=N`` line per worker) and reaches the workers as on
  a cluster: their names resolve and their sshd takes Open MPI's ``orted`` (tests/k8s_sim/sshd.py, the kubelet
  points ``plm_rsh_agent`` at its client). ``horovodrun`` gets ``localhost`` with all the job's slots and starts
  every rank on this machine (Gloo or MPI, whichever the local Horovod has): in Gloo mode it would also probe each
  host over ssh with task services of its own, which this double does not play. The node's GPUs are counted,
  not real: the kubelet leaves pgtrain's GPUS_PER_WORKER_ENV out of the containers' environment, so the ranks train
  on the CPU instead of refusing a run whose GPUs have no CUDA (trainer.device.select_device). With the node's
  ``pull_seconds`` set, an image the node has not pulled yet keeps its pod in ContainerCreating that long, with
  ``Pulling`` then ``Pulled`` events, as on a cold node; the node keeps the image afterwards.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from . import sshd
from .store import ApiError, Store, now

GROUP_VERSION = "kubeflow.org/v2beta1"
JOB_NAME = "training.kubeflow.org/job-name"
JOB_ROLE = "training.kubeflow.org/job-role"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
OPERATOR_NAME = "training.kubeflow.org/operator-name"
GPU = "nvidia.com/gpu"
CONFIG_MOUNT = "/etc/mpi"
KILL_GRACE_SECONDS = 3
QUEUE_NAME = "kueue.x-k8s.io/queue-name"
GPUS_PER_WORKER_ENV = "PGTRAIN_GPUS_PER_WORKER"  # pgtrain.launch.mpijob.api's: the simulated GPUs have no CUDA


def validation_errors(job: dict[str, Any]) -> list[str]:
    """The checks of mpi-operator's pkg/apis/kubeflow/validation (the controller rejects such jobs)."""
    errors = []
    name = job["metadata"]["name"]
    spec = job.get("spec") or {}
    replicas = spec.get("mpiReplicaSpecs") or {}
    workers = (replicas.get("Worker") or {}).get("replicas") or 1
    for hostname in (name, f"{name}-worker-{workers - 1}", f"{name}-launcher"):
        if len(hostname) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", hostname):
            errors.append(f"metadata.name: will not be able to create pod with invalid DNS label {hostname!r}")
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        errors.append(f"metadata.name: {name!r} is not a DNS-1035 label (the job's Service needs one)")
    if not isinstance(spec.get("slotsPerWorker"), int) or spec["slotsPerWorker"] < 0:
        errors.append("spec.slotsPerWorker: must have number of slots per worker")
    policy = spec.get("runPolicy") or {}
    if policy.get("cleanPodPolicy") not in ("None", "Running", "All"):
        errors.append("spec.runPolicy.cleanPodPolicy: must be None, Running or All")
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if key in policy and (not isinstance(policy[key], int) or policy[key] < 0):
            errors.append(f"spec.runPolicy.{key}: must be greater than or equal to 0")
    if not spec.get("sshAuthMountPath"):
        errors.append("spec.sshAuthMountPath: must have a mount path for SSH credentials")
    if spec.get("mpiImplementation") not in ("OpenMPI", "Intel", "MPICH"):
        errors.append("spec.mpiImplementation: unsupported value")
    if spec.get("launcherCreationPolicy", "AtStartup") not in ("AtStartup", "WaitForWorkersReady"):
        errors.append("spec.launcherCreationPolicy: unsupported value")
    for role in ("Launcher", "Worker"):
        replica = replicas.get(role)
        if replica is None:
            if role == "Launcher":
                errors.append("spec.mpiReplicaSpecs[Launcher]: must have Launcher replica spec")
            continue
        if not isinstance(replica.get("replicas"), int):
            errors.append(f"spec.mpiReplicaSpecs[{role}].replicas: must define number of replicas")
        elif role == "Launcher" and replica["replicas"] != 1:
            errors.append("spec.mpiReplicaSpecs[Launcher].replicas: must be 1")
        elif role == "Worker" and replica["replicas"] < 1:
            errors.append("spec.mpiReplicaSpecs[Worker].replicas: must be greater than or equal to 1")
        if replica.get("restartPolicy") not in ("Never", "OnFailure"):
            errors.append(f"spec.mpiReplicaSpecs[{role}].restartPolicy: supported values: Never, OnFailure")
        if not ((replica.get("template") or {}).get("spec") or {}).get("containers"):
            errors.append(f"spec.mpiReplicaSpecs[{role}].template.spec.containers: must define a container")
    return errors


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    stamp = now()
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastUpdateTime": stamp, "lastTransitionTime": stamp}


def _set_condition(job: dict[str, Any], kind: str, status: str, reason: str, message: str) -> None:
    conditions = job.setdefault("status", {}).setdefault("conditions", [])
    for cond in conditions:
        if cond["type"] == kind:
            if (cond["status"], cond.get("reason")) != (status, reason):
                cond.update(_condition(kind, status, reason, message))
            return
    conditions.append(_condition(kind, status, reason, message))


def _true(job: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in (job.get("status") or {}).get("conditions", []))


def _age_seconds(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    then = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    return (dt.datetime.now(dt.UTC) - then).total_seconds()


def _gpus(pod: dict[str, Any]) -> int:
    total = 0
    for container in pod["spec"].get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        total += int(limits.get(GPU, 0) or 0)
    return total


class Container:
    """One launcher container: a local process group whose output becomes the pod log."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        self.started_at = now()
        self.process = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.reader = threading.Thread(target=self._copy_output, daemon=True)
        self.reader.start()

    def _copy_output(self) -> None:
        assert self.process.stdout is not None
        with open(self.log_path, "ab", buffering=0) as log:
            for line in self.process.stdout:
                stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
                log.write(stamp + b" " + line.rstrip(b"\n") + b"\n")

    def exit_code(self) -> int | None:
        """The exit code once the process has ended and its output is fully in the log."""
        code = self.process.poll()
        if code is None:
            return None
        self.reader.join(timeout=5)
        return 128 + -code if code < 0 else code

    def kill(self) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=KILL_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass


class Cluster:
    def __init__(self, store: Store, state_dir: Path, image_bin_dir: Path, node_gpus: int) -> None:
        self.store = store
        self.state_dir = state_dir
        self.image_bin_dir = image_bin_dir
        self.node = {"name": "sim-gpu-node-0", "gpus": node_gpus, "pull_seconds": 0.0,
                     "labels": {"kubernetes.io/hostname": "sim-gpu-node-0", "nvidia.com/gpu.present": "true"}}
        self.images: set[str] = set()  # pulled onto the node
        self.pulls: dict[tuple[str, str], float] = {}  # (namespace, pod) -> when its image pull began
        self.containers: dict[tuple[str, str], Container] = {}
        self.failures: dict[tuple[str, str], int] = {}
        self.addresses = 0  # loopback addresses handed to worker pods (sshd.serve)
        self.stopping = threading.Event()

    # --- loop ---

    def run(self, interval: float = 0.1) -> None:
        while not self.stopping.wait(interval):
            try:
                self.reconcile()
            except Exception as exc:  # keep the cluster alive; the test sees the effect
                print(f"k8s-sim: reconcile error: {exc!r}", flush=True)

    def shutdown(self) -> None:
        self.stopping.set()
        for container in list(self.containers.values()):
            container.kill()

    def reconcile(self) -> None:
        jobs = self.store.list("mpijobs", None)
        for job in jobs:
            self.reconcile_job(job)
        self.collect_garbage({j["metadata"]["uid"] for j in jobs})
        self.schedule()
        self.kubelet()

    # --- MPI Operator ---

    def reconcile_job(self, job: dict[str, Any]) -> None:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        if job["metadata"].get("deletionTimestamp"):
            self.delete_dependents(ns, name)
            self.store.remove("mpijobs", ns, name, reason="foreground deletion finished")
            return
        if not (job.get("status") or {}).get("conditions"):
            self.start_job(job)
            return
        if _true(job, "Succeeded") or _true(job, "Failed"):
            ttl = job["spec"].get("runPolicy", {}).get("ttlSecondsAfterFinished")
            if ttl is not None and _age_seconds(job["status"].get("completionTime")) >= ttl:
                self.delete_dependents(ns, name)
                self.store.remove("mpijobs", ns, name, reason="ttlSecondsAfterFinished")
            return
        if _suspend(job):
            if not _true(job, "Suspended"):  # suspended after it started (Kueue preempted it): its pods go
                self.delete_dependents(ns, name)
                self.suspend(job)
            return
        if _true(job, "Suspended"):
            self.resume(job)
            return

        workers = self.store.list("pods", ns, f"{JOB_NAME}={name},{JOB_ROLE}=worker")
        launchers = sorted(self.store.list("pods", ns, f"{JOB_NAME}={name},{JOB_ROLE}=launcher"),
                           key=lambda p: p["metadata"]["resourceVersion"])
        if not launchers and all(_ready(w) for w in workers):
            self.create_pod(job, "Launcher", None)
            return
        deadline = job["spec"].get("runPolicy", {}).get("activeDeadlineSeconds")
        if deadline and _age_seconds(job["status"].get("startTime")) > deadline:
            for pod in launchers:
                self.kill(ns, pod["metadata"]["name"], "DeadlineExceeded")
            self.finish(job, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
            return
        if not launchers:
            return
        launcher = launchers[-1]
        phase = launcher["status"]["phase"]
        if phase == "Succeeded":
            self.finish(job, "Succeeded", "MPIJobSucceeded", f"MPIJob {ns}/{name} successfully completed.")
        elif phase == "Failed":
            key = (ns, name)
            self.failures[key] = self.failures.get(key, 0) + 1
            if self.failures[key] <= job["spec"].get("runPolicy", {}).get("backoffLimit", 6):
                self.create_pod(job, "Launcher", None)
            else:
                # As mpi-operator's updateMPIJobFailedStatus: the launcher Job's condition plus the last pod.
                self.finish(job, "Failed", "BackoffLimitExceeded/" + (launcher["status"].get("reason") or ""),
                            "Job has reached the specified backoff limit: "
                            + (launcher["status"].get("message") or ""))
        elif phase == "Running" and all(w["status"]["phase"] == "Running" for w in workers):
            if not _true(job, "Running"):
                self.store.update("mpijobs", ns, name, lambda j: _set_condition(
                    j, "Running", "True", "MPIJobRunning", f"MPIJob {ns}/{name} is running."),
                    verb="status", condition="Running")

    def start_job(self, job: dict[str, Any]) -> None:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        errors = validation_errors(job)
        if errors:  # the real controller only records a ValidationError event; the job never starts
            self.store.record("event", "mpijobs", ns, name, type="Warning", reason="ValidationError",
                              message="; ".join(errors))
            self.store.update("mpijobs", ns, name, lambda j: j.setdefault("status", {}).update(
                validationErrors=errors, conditions=[]))
            return

        def created(j: dict[str, Any]) -> None:
            _set_condition(j, "Created", "True", "MPIJobCreated", f"MPIJob {ns}/{name} is created.")
            if not _suspend(j):
                j["status"]["startTime"] = now()

        self.store.update("mpijobs", ns, name, created, verb="status", condition="Created")
        if _suspend(job):
            self.suspend(job)
        else:
            self.create_pods(job)

    def suspend(self, job: dict[str, Any]) -> None:
        """As mpi-operator's updateMPIJobStatus while runPolicy.suspend is true."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]

        def mark(j: dict[str, Any]) -> None:
            _set_condition(j, "Suspended", "True", "MPIJobSuspended", "MPIJob suspended")
            _set_condition(j, "Running", "False", "MPIJobSuspended", f"MPIJob {ns}/{name} is suspended.")

        self.store.update("mpijobs", ns, name, mark, verb="status", condition="Suspended")

    def resume(self, job: dict[str, Any]) -> None:
        """Unsuspended: the condition turns False (its lastTransitionTime is the resume), a new startTime, pods."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]

        def mark(j: dict[str, Any]) -> None:
            _set_condition(j, "Suspended", "False", "MPIJobResumed", "MPIJob resumed")
            j["status"]["startTime"] = now()

        self.store.update("mpijobs", ns, name, mark, verb="status", condition="Resumed")
        self.create_pods(job)

    def create_pods(self, job: dict[str, Any]) -> None:
        self.write_config(job)
        for index in range(job["spec"]["mpiReplicaSpecs"].get("Worker", {}).get("replicas", 0)):
            self.create_pod(job, "Worker", index)
        if job["spec"].get("launcherCreationPolicy", "AtStartup") == "AtStartup":
            self.create_pod(job, "Launcher", None)

    def write_config(self, job: dict[str, Any]) -> None:
        """The <job>-config ConfigMap, mounted at /etc/mpi: the MPI Operator's hostfile for mpirun; for
        horovodrun, every slot on this machine (see the module's doc)."""
        spec = job["spec"]
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        workers = spec["mpiReplicaSpecs"].get("Worker", {}).get("replicas", 0)
        slots = spec.get("slotsPerWorker", 1)
        launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
        programs = {Path(part).name for part in [*(launcher.get("command") or []), *(launcher.get("args") or [])]}
        hosts = ("".join(f"{name}-worker-{i}.{name}-worker.{ns}.svc slots={slots}\n" for i in range(workers))
                 if "mpirun" in programs and "horovodrun" not in programs else f"localhost slots={workers * slots}\n")
        directory = self.config_dir(ns, name)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "hostfile").write_text(hosts)

    def config_dir(self, ns: str, name: str) -> Path:
        return self.state_dir / "configmaps" / ns / f"{name}-config"

    def create_pod(self, job: dict[str, Any], role: str, index: int | None) -> None:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        replica = job["spec"]["mpiReplicaSpecs"][role]
        template = replica["template"]
        pod_name = f"{name}-worker-{index}" if role == "Worker" else f"{name}-launcher-{uuid.uuid4().hex[:5]}"
        labels = {**(template.get("metadata") or {}).get("labels", {}),
                  JOB_NAME: name, JOB_ROLE: role.lower(), REPLICA_TYPE: role.lower(), OPERATOR_NAME: "mpi-operator"}
        if index is not None:
            labels[REPLICA_INDEX] = str(index)
        spec = {**template["spec"], "restartPolicy": replica.get("restartPolicy", "Never"),
                "hostname": pod_name if role == "Worker" else f"{name}-launcher", "subdomain": f"{name}-worker"}
        containers = spec.get("containers") or []
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "labels": labels,
                         "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
                         "ownerReferences": [{"apiVersion": GROUP_VERSION, "kind": "MPIJob", "name": name,
                                              "uid": job["metadata"]["uid"], "controller": True}]},
            "spec": spec,
            "status": {"phase": "Pending", "conditions": [], "qosClass": "Burstable",
                       "containerStatuses": [_waiting(c, "ContainerCreating", None) for c in containers]},
        }
        self.store.create("pods", ns, pod, actor="mpi-operator")

    def finish(self, job: dict[str, Any], kind: str, reason: str, message: str) -> None:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]

        def mark(j: dict[str, Any]) -> None:
            if _true(j, "Running"):
                _set_condition(j, "Running", "False", reason, message)
            _set_condition(j, kind, "True", reason, message)
            j["status"]["completionTime"] = now()

        self.store.update("mpijobs", ns, name, mark, verb="status", condition=kind, reason=reason)
        policy = job["spec"].get("runPolicy", {}).get("cleanPodPolicy", "Running")
        for pod in self.store.list("pods", ns, f"{JOB_NAME}={name}"):
            active = pod["status"]["phase"] in ("Pending", "Running")
            if policy == "All" or (policy == "Running" and active):
                self.kill(ns, pod["metadata"]["name"], "cleanPodPolicy")
                self.store.remove("pods", ns, pod["metadata"]["name"], reason=f"cleanPodPolicy {policy}")

    def delete_dependents(self, ns: str, name: str) -> None:
        for pod in self.store.list("pods", ns, f"{JOB_NAME}={name}"):
            self.kill(ns, pod["metadata"]["name"], "owner deleted")
            self.store.remove("pods", ns, pod["metadata"]["name"], reason="owner deleted")

    def collect_garbage(self, live_uids: set[str]) -> None:
        """Background deletion: pods whose MPIJob is gone follow it."""
        for pod in self.store.list("pods", None):
            owners = pod["metadata"].get("ownerReferences") or []
            if owners and not any(o["uid"] in live_uids for o in owners):
                ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                self.kill(ns, pod_name, "owner deleted")
                self.store.remove("pods", ns, pod_name, reason="garbage collected")

    def kill(self, ns: str, pod_name: str, why: str) -> None:
        container = self.containers.pop((ns, pod_name), None)
        if container is not None:
            container.kill()
            self.store.record("kill", "pods", ns, pod_name, reason=why)

    # --- scheduler ---

    def schedule(self) -> None:
        pods = self.store.list("pods", None)
        used = sum(_gpus(p) for p in pods
                   if p["spec"].get("nodeName") and p["status"]["phase"] in ("Pending", "Running"))
        for pod in pods:
            if pod["spec"].get("nodeName") or pod["status"]["phase"] != "Pending":
                continue
            ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            selector = pod["spec"].get("nodeSelector") or {}
            if any(self.node["labels"].get(k) != v for k, v in selector.items()):
                message = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
            elif _gpus(pod) > self.node["gpus"] - used:
                message = f"0/1 nodes are available: 1 Insufficient {GPU}."
            else:
                used += _gpus(pod)

                def bind(p: dict[str, Any]) -> None:
                    p["spec"]["nodeName"] = self.node["name"]
                    p["status"]["conditions"] = [_condition("PodScheduled", "True", "", "")]
                    p["status"]["startTime"] = now()

                self.store.update("pods", ns, pod_name, bind, verb="bind")
                continue

            def unschedulable(p: dict[str, Any], message: str = message) -> None:
                p["status"]["conditions"] = [_condition("PodScheduled", "False", "Unschedulable", message)]

            self.store.update("pods", ns, pod_name, unschedulable)

    # --- kubelet ---

    def kubelet(self) -> None:
        for pod in self.store.list("pods", None):
            ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            if not pod["spec"].get("nodeName"):
                continue
            if pod["status"]["phase"] == "Pending":
                self.start_pod(pod)
            elif pod["status"]["phase"] == "Running" and (ns, pod_name) in self.containers:
                code = self.containers[(ns, pod_name)].exit_code()
                if code is not None:
                    self.containers.pop((ns, pod_name))
                    self.store.update("pods", ns, pod_name, lambda p, c=code: _terminate(p, c),
                                      verb="status", phase="Succeeded" if code == 0 else "Failed", exitCode=code)

    def start_pod(self, pod: dict[str, Any]) -> None:
        ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        if not self.image_ready(ns, pod_name, container.get("image", "")):
            return
        try:
            mounts = self.mount_volumes(ns, pod, container)
        except ApiError as exc:
            self.failed_mount(ns, pod_name, container, exc.message)
            return
        try:
            env = self.container_env(ns, pod, container)
        except ApiError as exc:
            waiting = _waiting(container, "CreateContainerConfigError", exc.message)
            self.store.update("pods", ns, pod_name, lambda p: p["status"].update(containerStatuses=[waiting]))
            return
        is_launcher = pod["metadata"]["labels"].get(JOB_ROLE) == "launcher"
        if is_launcher:
            job = pod["metadata"]["labels"][JOB_NAME]
            mounts[CONFIG_MOUNT] = self.config_dir(ns, job)
            argv = [_map_path(_expand(a, env), mounts)
                    for a in [*(container.get("command") or []), *(container.get("args") or [])]]
            env = {k: _map_path(v, mounts) for k, v in env.items()}
            workdir = self.state_dir / "pods" / ns / pod_name
            workdir.mkdir(parents=True, exist_ok=True)
            env.setdefault("HOME", str(workdir))
            try:
                self.containers[(ns, pod_name)] = Container(argv, env, workdir, self.log_path(ns, pod_name))
            except OSError as exc:  # like a runtime that cannot exec the entrypoint
                message = str(exc)
                self.store.update("pods", ns, pod_name, lambda p: _terminate(p, 128, message),
                                  verb="status", phase="Failed", exitCode=128)
                return
            self.store.record("exec", "pods", ns, pod_name, argv=argv)
        else:
            self.serve_ssh(ns, pod, container)

        def running(p: dict[str, Any]) -> None:
            p["status"]["phase"] = "Running"
            p["status"]["conditions"] = [_condition(t, "True", "", "") for t in
                                         ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
            p["status"]["containerStatuses"] = [{
                "name": container["name"], "image": container.get("image", ""), "imageID": "",
                "ready": True, "started": True, "restartCount": 0,
                "state": {"running": {"startedAt": now()}}}]

        self.store.update("pods", ns, pod_name, running, verb="status", phase="Running")

    def serve_ssh(self, ns: str, pod: dict[str, Any], container: dict[str, Any]) -> None:
        """A worker on the pod network: its name resolves, its sshd (if its command is one) takes logins."""
        self.addresses += 1
        address = f"127.1.{self.addresses // 250}.{self.addresses % 250 + 1}"
        fqdn = f"{pod['spec'].get('hostname') or pod['metadata']['name']}.{pod['spec'].get('subdomain')}.{ns}.svc"
        home = self.state_dir / "pods" / ns / pod["metadata"]["name"]
        home.mkdir(parents=True, exist_ok=True)
        sshd.serve(self.state_dir, fqdn, address, sshd.worker_port(container.get("command") or []), home,
                   sshd.session_env(home, self.image_env()))

    def image_env(self) -> dict[str, str]:
        """What every process of the simulated image has: a UTF-8 locale, the checkout under test (not what the venv
        installed) and the cluster's DNS."""
        env = {"LANG": "C.UTF-8", **sshd.dns_env(self.state_dir)}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return env

    def container_env(self, ns: str, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        env = {"PATH": f"{self.image_bin_dir}:/usr/local/bin:/usr/bin:/bin", **self.image_env(),
               "HOSTNAME": pod["spec"].get("hostname") or pod["metadata"]["name"]}
        role = pod["metadata"]["labels"].get(JOB_ROLE, "")
        env["K_MPI_JOB_ROLE"] = role
        if role == "launcher":  # what mpi-operator adds for OpenMPI; the ssh client is the simulated sshd's
            env.update(OMPI_MCA_orte_keep_fqdn_hostnames="true",
                       OMPI_MCA_orte_default_hostfile=f"{CONFIG_MOUNT}/hostfile",
                       OMPI_MCA_plm_rsh_args="-o ConnectionAttempts=10",
                       OMPI_MCA_plm_rsh_agent=str(sshd.client(self.state_dir)))
        for source in container.get("envFrom") or []:
            ref = source.get("secretRef")
            if ref:
                env.update({source.get("prefix", "") + k: v for k, v in self.secret_data(ns, ref["name"]).items()})
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = _expand(str(item["value"]), env)
            elif (ref := (item.get("valueFrom") or {}).get("secretKeyRef")) is not None:
                data = self.secret_data(ns, ref["name"])
                if ref["key"] not in data:
                    raise ApiError(422, "Invalid", f"couldn't find key {ref['key']} in Secret {ns}/{ref['name']}")
                env[item["name"]] = data[ref["key"]]
        env.pop(GPUS_PER_WORKER_ENV, None)
        return env

    def mount_volumes(self, ns: str, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Path]:
        """Write the container's ``secret`` volumes under the pod's directory; mountPath -> local directory."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            source = (volumes.get(mount["name"]) or {}).get("secret")
            if source is None:
                continue
            prefix = f'MountVolume.SetUp failed for volume "{mount["name"]}" : '
            try:
                data = self.secret_data(ns, source["secretName"])
            except ApiError as exc:
                raise ApiError(exc.code, exc.reason, prefix + exc.message) from None
            items = source.get("items") or [{"key": key, "path": key} for key in data]
            directory = self.state_dir / "pods" / ns / pod["metadata"]["name"] / "volumes" / mount["name"]
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            for item in items:
                if item["key"] not in data:
                    raise ApiError(422, "Invalid", prefix + f"references non-existent secret key: {item['key']}")
                path = directory / item["path"]
                path.write_text(data[item["key"]])
                path.chmod(item.get("mode", source.get("defaultMode", 0o644)))
            mounts[mount["mountPath"]] = directory
        return mounts

    def image_ready(self, ns: str, pod_name: str, image: str) -> bool:
        """Whether the node has ``image``; else pull it for ``pull_seconds`` (Pulling, then Pulled events)."""
        if image in self.images or not self.node["pull_seconds"]:
            return True
        if (ns, pod_name) not in self.pulls:
            self.pulls[(ns, pod_name)] = time.monotonic()
            self.event(ns, pod_name, "pulling", "Pulling", f'Pulling image "{image}"')
        if time.monotonic() - self.pulls[(ns, pod_name)] < self.node["pull_seconds"]:
            return False
        self.images.add(image)
        self.event(ns, pod_name, "pulled", "Pulled", f'Successfully pulled image "{image}" in '
                                                     f'{self.node["pull_seconds"]}s')
        return True

    def event(self, ns: str, pod_name: str, suffix: str, reason: str, message: str) -> None:
        self.store.create("events", ns, {
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{pod_name}.{suffix}"},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": pod_name},
            "reason": reason, "message": message, "type": "Normal", "count": 1,
            "source": {"component": "kubelet"}, "firstTimestamp": now(), "lastTimestamp": now()}, actor="kubelet")

    def failed_mount(self, ns: str, pod_name: str, container: dict[str, Any], message: str) -> None:
        """ContainerCreating, and a FailedMount Warning event on the pod (counted, as the kubelet does)."""
        event_name = f"{pod_name}.failedmount"
        try:
            self.store.update("events", ns, event_name, lambda e: e.update(count=e["count"] + 1, lastTimestamp=now()))
        except ApiError:
            self.store.create("events", ns, {
                "apiVersion": "v1", "kind": "Event", "metadata": {"name": event_name},
                "involvedObject": {"kind": "Pod", "namespace": ns, "name": pod_name},
                "reason": "FailedMount", "message": message, "type": "Warning", "count": 1,
                "source": {"component": "kubelet"}, "firstTimestamp": now(), "lastTimestamp": now()},
                actor="kubelet")
        waiting = _waiting(container, "ContainerCreating", None)
        self.store.update("pods", ns, pod_name, lambda p: p["status"].update(containerStatuses=[waiting]))

    def secret_data(self, ns: str, name: str) -> dict[str, str]:
        try:
            secret = self.store.get("secrets", ns, name)
        except ApiError:
            raise ApiError(404, "NotFound", f'secret "{name}" not found') from None
        data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
        data.update(secret.get("stringData") or {})
        return data

    def log_path(self, ns: str, pod_name: str) -> Path:
        return self.state_dir / "logs" / ns / f"{pod_name}.log"


def _suspend(job: dict[str, Any]) -> bool:
    return bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def _waiting(container: dict[str, Any], reason: str, message: str | None) -> dict[str, Any]:
    waiting = {"reason": reason, **({"message": message} if message else {})}
    return {"name": container.get("name", ""), "image": container.get("image", ""), "imageID": "",
            "ready": False, "started": False, "restartCount": 0, "state": {"waiting": waiting}}


def _terminate(pod: dict[str, Any], code: int, message: str | None = None) -> None:
    pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
    started = ((pod["status"].get("containerStatuses") or [{}])[0].get("state") or {}).get("running", {})
    for cond in pod["status"].get("conditions") or []:
        if cond["type"] in ("Ready", "ContainersReady"):
            cond["status"] = "False"
    name = pod["spec"]["containers"][0]["name"]
    terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                  "startedAt": started.get("startedAt", now()), "finishedAt": now()}
    if message:
        terminated["message"] = message
    pod["status"]["containerStatuses"] = [{"name": name, "image": pod["spec"]["containers"][0].get("image", ""),
                                           "imageID": "", "ready": False, "started": False, "restartCount": 0,
                                           "state": {"terminated": terminated}}]


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values; $$(VAR) escapes."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _map_path(text: str, mounts: dict[str, Path]) -> str:
    """A container path under one of the pod's mounts, seen from this machine."""
    for mount_path, local in mounts.items():
        if text == mount_path or text.startswith(mount_path + "/"):
            return str(local) + text[len(mount_path):]
    return text
