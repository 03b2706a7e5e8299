"""How an MPIJob fails, as the task's error: which kind (a retry may help, or not), and a message that says what
happened and what to do."""

from __future__ import annotations

from pgtrain.core.errors import ConfigError, TrainingFailed, TrainingInputError
from pgtrain.launch.mpijob import api
from pgtrain.launch.mpijob.watch import RESUMED_REASON, WatchVerdict


class MPIJobStartupTimeout(TrainingFailed):
    """The MPIJob did not start in time (typically: not enough free GPUs); it has been deleted."""


class MPIOperatorMissing(ConfigError):
    """The cluster does not serve MPIJobs (the MPI Operator's CRD is not installed): retrying cannot help."""


def mpi_operator_missing() -> MPIOperatorMissing:
    return MPIOperatorMissing(
        f"the cluster does not serve {api.API_GROUP}/{api.API_VERSION} {api.PLURAL} (the MPIJob CRD is not "
        f"installed): install the MPI Operator {api.MPI_OPERATOR_VERSION} (kubectl apply --server-side -f "
        f"https://raw.githubusercontent.com/kubeflow/mpi-operator/{api.MPI_OPERATOR_VERSION}/deploy/v2beta1/"
        "mpi-operator.yaml; see docs/kubernetes.md)")


class MPIJobFailed(TrainingFailed):
    """The MPIJob ended with its Failed condition."""


class MPIJobStalled(MPIJobFailed):
    """The running MPIJob recorded no new epoch for its stall_timeout and was deleted: a retry resumes it."""


class MPIJobInputRefused(MPIJobFailed, TrainingInputError):
    """The MPIJob failed because a rank refused its planned input: retrying cannot help."""


def cannot_start(namespace: str, name: str, why: str, secret: str, secret_key: str) -> MPIJobStartupTimeout:
    """A pod of the job can never start (a missing Secret, a bad image name): the job has been deleted."""
    return MPIJobStartupTimeout(
        f"MPIJob {namespace}/{name} cannot start: {why}. Create the Secret {secret!r} (key {secret_key!r}) in "
        f"namespace {namespace} or fix the image; see docs/kubernetes.md. The MPIJob was deleted.")


def not_started(namespace: str, name: str, timeout_seconds: float, verdict: WatchVerdict) -> MPIJobStartupTimeout:
    """The job was not running ``timeout_seconds`` after its creation, or after it left its queue (a ``timeout``
    verdict: its message says what the pods wait for): it has been deleted."""
    queued = verdict.reason == RESUMED_REASON
    counted = (", counted from when it left its queue or its pods' last sign of progress" if queued else
               ", counted from its pods' last sign of progress")
    if verdict.message:
        waiting = f"waiting: {verdict.message}. Free GPUs, request fewer (world_size, gpus_per_worker)"
    elif queued:  # the MPI Operator saw the job (it set the Suspended condition), yet made no pods
        waiting = (f"no pods were created since it was admitted (kubectl describe mpijob -n {namespace} {name} "
                   "shows its events)")
    else:
        waiting = (f"no pods were created: is the MPI Operator {api.MPI_OPERATOR_VERSION} running and watching this "
                   f"namespace? (kubectl describe mpijob -n {namespace} {name} shows its events)")
    return MPIJobStartupTimeout(
        f"MPIJob {namespace}/{name} was not running after {timeout_seconds}s (startup_timeout_seconds{counted}); "
        f"{waiting}, or raise the timeout. The MPIJob was deleted.")


def job_failed(namespace: str, name: str, verdict: WatchVerdict, recorded: tuple[str, str] | None,
               exit_status: str, tail: list[str]) -> MPIJobFailed:
    """The job's Failed condition, with the trainer's recorded verdict (a refusal is not retried), the launcher's
    exit status and its last log lines."""
    lines = "\n".join(tail) or "(no launcher output; set get_logs=True to capture it)"
    refused = recorded is not None and recorded[0] == "refused"
    said = f"\ntrainer verdict: {recorded[0]}: {recorded[1]}" if recorded else ""
    return (MPIJobInputRefused if refused else MPIJobFailed)(
        f"MPIJob {namespace}/{name} failed: {verdict.reason.rstrip('/') or 'Failed'}: {verdict.message}{said}"
        f"{exit_status}\nlast {len(tail)} launcher log lines:\n{lines}")
