"""The MPIJob manifest: layout, v2beta1 rules, Kubernetes schemas, names, credentials, the render command."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from contextlib import redirect_stdout

import pytest
import yaml

from pgtrain.core.database_url import DATABASE_URL_ENV, DATABASE_URL_FILE_ENV
from pgtrain.core.errors import ConfigError
from pgtrain.launch.mpijob import api, cli, spec, validation, watch
from pgtrain.launch.trainer_command import trainer_argv
from tests.k8s_sim.validation import assert_valid_mpijob

LAYOUTS = [(1, 1), (2, 1), (2, 4), (8, 4), (16, 8), (64, 8), (1024, 1)]
LONG_RUN_ID = "a_rather_long_dag_id_for_training/scheduled__2026-01-01T00:00:00+00:00" * 2


def settings(world_size: int = 8, gpus: int = 4, **overrides) -> spec.MPIJobSettings:
    return spec.MPIJobSettings(run_id=overrides.pop("run_id", LONG_RUN_ID), world_size=world_size,
                                 gpus_per_worker=gpus, image="registry.example/pgtrain-trainer:1",
                                 attempt=overrides.pop("attempt", 3), **overrides)


def replica(manifest: dict, role: str) -> dict:
    return manifest["spec"]["mpiReplicaSpecs"][role]


def container(manifest: dict, role: str) -> dict:
    return replica(manifest, role)["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(("world_size", "gpus"), LAYOUTS)
def test_manifest_follows_the_v2beta1_rules(world_size, gpus):
    manifest = spec.build_mpijob(settings(world_size, gpus))
    job = manifest["spec"]
    workers, slots = -(-world_size // gpus), min(gpus, world_size)
    assert manifest["apiVersion"] == "kubeflow.org/v2beta1" and manifest["kind"] == "MPIJob"
    assert replica(manifest, "Launcher")["replicas"] == 1
    assert replica(manifest, "Worker")["replicas"] == workers
    assert job["slotsPerWorker"] == slots
    assert container(manifest, "Worker")["resources"]["limits"][api.GPU_RESOURCE] == slots
    assert container(manifest, "Worker")["resources"]["requests"].keys() >= {"cpu", "memory"}
    launcher_resources = container(manifest, "Launcher")["resources"]
    assert api.GPU_RESOURCE not in {**launcher_resources.get("limits", {}), **launcher_resources["requests"]}
    assert replica(manifest, "Launcher")["restartPolicy"] in ("Never", "OnFailure")
    assert replica(manifest, "Worker")["restartPolicy"] in ("Never", "OnFailure")
    assert job["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert job["runPolicy"]["cleanPodPolicy"] == "Running"
    assert {"backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"} <= job["runPolicy"].keys()
    command = container(manifest, "Launcher")["command"]
    assert command[:3] == ["horovodrun", "-np", str(workers * slots)]
    assert command[-len(trainer_argv(LONG_RUN_ID, 3)):] == trainer_argv(LONG_RUN_ID, 3)
    assert command[-2:] == ["--attempt", "3"]
    name = manifest["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)
    assert len(f"{name}-worker-{workers - 1}") <= 63 and len(f"{name}-launcher") <= 63
    assert list(validation.mpijob_problems(manifest)) == []


@pytest.mark.parametrize(("world_size", "gpus"), LAYOUTS)
def test_pod_templates_are_valid_kubernetes(world_size, gpus):
    assert_valid_mpijob(spec.build_mpijob(settings(world_size, gpus, node_selector={"gpu": "h100"},
                                            tolerations=[{"key": api.GPU_RESOURCE, "operator": "Exists",
                                                          "effect": "NoSchedule"}])))


def test_database_url_only_from_the_secret_mounted_as_a_file():
    manifest = spec.build_mpijob(settings(database_secret="team-db", database_secret_key="dsn"))
    for role in ("Launcher", "Worker"):
        pod_spec = manifest["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
        env = {e["name"]: e for e in container(manifest, role)["env"]}
        assert DATABASE_URL_ENV not in env  # Horovod's Gloo launcher would put an env var on `ps`-visible lines
        assert env[DATABASE_URL_FILE_ENV] == {"name": DATABASE_URL_FILE_ENV, "value": "/var/run/secrets/pgtrain/url"}
        (volume,) = [v for v in pod_spec["volumes"] if v["name"] == api.DATABASE_VOLUME]
        assert volume["secret"] == {"secretName": "team-db", "items": [{"key": "dsn", "path": "url"}],
                                    "defaultMode": 0o400}
        assert {"name": api.DATABASE_VOLUME, "mountPath": "/var/run/secrets/pgtrain", "readOnly": True} in \
            container(manifest, role)["volumeMounts"]
    assert validation.credential_literals(manifest) == []


def test_a_url_file_is_read_and_its_problems_explained(tmp_path, monkeypatch):
    from pgtrain.core.database_url import database_url

    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    url_file = tmp_path / "url"
    url_file.write_text("postgresql://trainer:s3cret@db/training\n")
    monkeypatch.setenv(DATABASE_URL_FILE_ENV, str(url_file))
    assert database_url() == "postgresql://trainer:s3cret@db/training"
    url_file.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        database_url()
    monkeypatch.setenv(DATABASE_URL_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="is the Secret with the database URL mounted there"):
        database_url()


def test_importing_the_module_does_not_load_the_database_driver():
    """DAG files import pgtrain.launch.mpijob.spec at parse time: it must not pull in psycopg (pgtrain.core.db does)."""
    code = "import sys, pgtrain.launch.mpijob.spec; print('psycopg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_credential_literals_are_found_and_rejected():
    manifest = spec.build_mpijob(settings())
    container(manifest, "Worker")["env"].append({"name": "OTHER", "value": "postgresql://u:hunter2@db/x"})
    assert validation.credential_literals(manifest) == [
        "spec.mpiReplicaSpecs.Worker.template.spec.containers[0].env[3].value"]
    container(manifest, "Launcher")["env"][0] = {"name": DATABASE_URL_ENV, "value": "postgresql://db/x"}
    with pytest.raises(ConfigError) as error:
        validation.validate_mpijob(manifest)
    assert "must come from the Secret mounted at" in str(error.value) and "looks like a credential" in str(error.value)
    assert validation.credential_literals({"dsn": "host=db password=hunter2"})
    assert not validation.credential_literals({"url": "postgresql://u@/db?host=/tmp"})


def test_violations_of_the_operator_rules_are_reported():
    manifest = spec.build_mpijob(settings())
    replica(manifest, "Launcher")["replicas"] = 2
    replica(manifest, "Worker")["restartPolicy"] = "Always"
    container(manifest, "Launcher")["resources"]["limits"][api.GPU_RESOURCE] = 1
    manifest["metadata"]["name"] = "x" * 60
    problems = "\n".join(validation.mpijob_problems(manifest))
    for expected in ("Launcher replicas must be 1", "Worker restartPolicy 'Always'",
                     "Launcher must not request GPUs", "would be longer than 63"):
        assert expected in problems


def test_uneven_layout_is_refused_with_advice():
    with pytest.raises(ConfigError, match=r"world_size=6 is not a multiple of gpus_per_worker=4.*e\.g\. 8"):
        settings(6, 4)
    assert spec.layout(2, 4) == (1, 2)
    assert spec.layout(8, 4) == (2, 4)


def test_job_names_are_unique_per_attempt_and_bounded():
    names = {spec.job_name("pgtrain_training", "train", "manual__2026", -1, attempt, workers=128)
             for attempt in (1, 2, 3)}
    assert len(names) == 3
    long = spec.job_name("9" * 300, "Train_Task", workers=1024)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", long) and len(f"{long}-worker-1023") <= 63


def test_job_state_reads_the_conditions():
    def job(*conditions):
        return {"status": {"conditions": [{"type": t, "status": s, "reason": f"r-{t}", "message": f"m-{t}"}
                                          for t, s in conditions]}}

    assert watch.job_state({}).phase == "Pending"
    assert watch.job_state(job(("Created", "True"))).phase == "Pending"
    assert watch.job_state(job(("Created", "True"), ("Running", "True"))).phase == "Running"
    finished = watch.job_state(job(("Running", "False"), ("Failed", "True")))
    assert (finished.phase, finished.reason, finished.message, finished.finished) == ("Failed", "r-Failed",
                                                                                      "m-Failed", True)
    assert watch.job_state(job(("Running", "False"), ("Succeeded", "True"))).phase == "Succeeded"


def render(args: list[str]) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(args) == 0
    return yaml.safe_load(out.getvalue())


def test_render_command_prints_what_the_builder_builds():
    rendered = render(["render", "--world-size", "8", "--gpus-per-worker", "4", "--image", "reg/img:1",
                       "--run-id", "d/r", "--node-selector", "pool=gpu", "--toleration", "nvidia.com/gpu:NoSchedule",
                       "--attempt", "4"])
    expected = spec.build_mpijob(spec.MPIJobSettings(
        run_id="d/r", world_size=8, gpus_per_worker=4, image="reg/img:1", node_selector={"pool": "gpu"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], attempt=4))
    assert rendered == expected
    assert container(rendered, "Launcher")["command"][-2:] == ["--attempt", "4"]
    assert replica(rendered, "Worker")["replicas"] == 2
    assert replica(rendered, "Worker")["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}


def test_render_command_tells_the_trainer_attempt_1_by_default():
    rendered = render(["render", "--world-size", "2", "--run-id", "d/r"])
    assert container(rendered, "Launcher")["command"][-4:] == ["--run-id", "d/r", "--attempt", "1"]


def test_settings_need_a_train_attempt():
    with pytest.raises(TypeError, match="attempt"):
        spec.MPIJobSettings(run_id="r", world_size=1)  # type: ignore[call-arg]
    for bad in (0, -1, None, True, "2"):
        with pytest.raises(ConfigError, match=f"attempt={bad!r} should be the run's train attempt"):
            settings(attempt=bad)


def test_render_command_explains_a_bad_layout(capsys):
    assert cli.main(["render", "--world-size", "6", "--gpus-per-worker", "4", "--run-id", "r"]) == 2
    assert "not a multiple of gpus_per_worker" in capsys.readouterr().err


# --- watch_step: one look at a job and its pods, shared by the operator's loop and its trigger ---

def _job(*conditions: tuple[str, str, str]) -> dict:
    return {"metadata": {"creationTimestamp": "1970-01-01T00:00:00Z"},  # now=60: a minute after its creation
            "status": {"conditions": [{"type": t, "status": "True", "reason": r, "message": m}
                                      for t, r, m in conditions]}}


def _pod(name: str, waiting: dict | None = None, unschedulable: str | None = None) -> dict:
    status: dict = {"phase": "Pending"}
    if waiting:
        status["containerStatuses"] = [{"state": {"waiting": waiting}}]
    if unschedulable:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": unschedulable}]
    return {"metadata": {"name": name}, "status": status}


def test_watch_step_reads_finished_jobs_from_their_conditions():
    done = watch.watch_step(_job(("Created", "", ""), ("Succeeded", "MPIJobSucceeded", "ok")), [], 0, 100)
    failed = watch.watch_step(_job(("Failed", "BackoffLimitExceeded", "launcher failed")), [], 0, 100)
    assert (done.outcome, done.done, failed.outcome, failed.reason) == (
        "succeeded", True, "failed", "BackoffLimitExceeded")


def test_watch_step_fails_fast_on_a_container_that_can_never_start():
    pods = [_pod("job-launcher", {"reason": "CreateContainerConfigError", "message": 'secret "db" not found'})]
    verdict = watch.watch_step(_job(("Created", "", "")), pods, now=0, startup_timeout=3600)
    assert verdict.outcome == "cannot_start" and 'secret "db" not found' in verdict.message


def test_watch_step_fails_fast_when_the_database_secret_cannot_be_mounted():
    pods = [_pod("job-worker-0", {"reason": "ContainerCreating"})]
    message = f'MountVolume.SetUp failed for volume "{api.DATABASE_VOLUME}" : secret "db" not found'
    failed_mount = {"reason": "FailedMount", "message": message,
                    "involvedObject": {"kind": "Pod", "name": "job-worker-0"}}
    other_pod = {**failed_mount, "involvedObject": {"kind": "Pod", "name": "another-job-worker-0"}}
    verdict = watch.watch_step(_job(("Created", "", "")), pods, 0, 3600, events=[failed_mount])
    assert verdict.outcome == "cannot_start" and verdict.message == f"job-worker-0: FailedMount: {message}"
    assert watch.watch_step(_job(("Created", "", "")), pods, 0, 3600, events=[other_pod]).outcome == "waiting"


def test_watch_step_times_out_only_a_job_that_never_started():
    pods = [_pod("job-worker-0", unschedulable="0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")]
    waiting = watch.watch_step(_job(), pods, now=10, startup_timeout=60)
    timeout = watch.watch_step(_job(), pods, now=60, startup_timeout=60)
    started = watch.watch_step(_job(), pods, now=600, startup_timeout=60, state=watch.WatchState(started=True))
    assert (waiting.outcome, waiting.done) == ("waiting", False)
    assert timeout.outcome == "timeout" and "Insufficient nvidia.com/gpu" in timeout.message
    assert (started.outcome, started.done) == ("running", False)


@pytest.mark.parametrize("non_root", [False, True])
def test_the_torch_backend_s_launcher_runs_mpirun_and_the_manifest_validates(non_root):
    """backend torch: mpirun (no horovodrun) starts the ranks, passing the URL file's path and the author's env by
    name; the trainer is told its backend and timeout; the manifest passes the CRD and Kubernetes schemas."""
    manifest = spec.build_mpijob(settings(8, 4, backend="torch", collective_timeout=120, non_root=non_root,
                                          env={"NCCL_DEBUG": "INFO"}))
    command = container(manifest, "Launcher")["command"]
    # the launcher reads the hostfile (the workers have none) and hands its first host to every rank
    assert command[:4] == ["python", "-m", "pgtrain.launch.mpijob.rendezvous", "mpirun"]
    assert ("--allow-run-as-root" in command) is not non_root
    assert command[command.index("-np") + 1] == "8" and command[command.index("--hostfile") + 1] == api.HOSTFILE
    passed = [command[i + 1] for i, part in enumerate(command) if part == "-x"]
    assert {DATABASE_URL_FILE_ENV, api.GPUS_PER_WORKER_ENV, "NCCL_DEBUG", "MASTER_ADDR"} <= set(passed)
    assert DATABASE_URL_ENV not in passed
    argv = trainer_argv(LONG_RUN_ID, 3, backend="torch", collective_timeout=120)
    assert command[-len(argv):] == argv and "--backend" in argv and "120" in argv
    assert "horovodrun" not in command
    assert list(validation.mpijob_problems(manifest)) == []
    assert_valid_mpijob(manifest)


def test_the_torch_ranks_are_told_rank_0_s_host_which_only_the_launcher_s_hostfile_names():
    """The MPI Operator mounts /etc/mpi on the launcher only: the launcher reads the hostfile's first host (worker-0,
    where --map-by slot puts rank 0) into MASTER_ADDR (pgtrain.launch.mpijob.rendezvous, tests/unit/test_collectives)
    and mpirun passes it by name; an author's MASTER_ADDR in env is the one passed."""
    command = container(spec.build_mpijob(settings(8, 4, backend="torch")), "Launcher")["command"]
    assert command[:3] == ["python", "-m", "pgtrain.launch.mpijob.rendezvous"]
    assert command[command.index("MASTER_ADDR") - 1] == "-x"
    assert "MASTER_ADDR" not in " ".join(container(spec.build_mpijob(settings(8, 4)), "Launcher")["command"])
    own = container(spec.build_mpijob(settings(8, 4, backend="torch", env={"MASTER_ADDR": "rdzv.ml.svc"})),
                    "Launcher")["command"]
    assert [part for part in own if "MASTER_ADDR" in part] == ["MASTER_ADDR"]  # -x MASTER_ADDR, once


@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_every_rank_is_told_how_many_gpus_its_worker_holds(backend):
    """The launcher passes its environment to the ranks: with GPUs held, a rank without CUDA refuses the run
    (trainer.device.select_device) instead of training on the CPU."""
    manifest = spec.build_mpijob(settings(8, 4, backend=backend))
    for role in ("Launcher", "Worker"):
        env = {e["name"]: e.get("value") for e in container(manifest, role)["env"]}
        assert env[api.GPUS_PER_WORKER_ENV] == "4"


@pytest.mark.parametrize(("ifname", "option"), [("eth0", ["--network-interfaces", "eth0"]),
                                               ("ib0,eth1", ["--network-interfaces", "ib0,eth1"]),
                                               ("^docker,lo", []), ("eth", [])])
def test_horovodrun_uses_the_authors_nccl_interface_instead_of_overriding_it(ifname, option):
    """horovodrun puts NCCL_SOCKET_IFNAME=<the interfaces it found> on the ranks' mpirun line, over the environment's:
    exact names become its --network-interfaces; NCCL's exclusions and prefixes are no interface names."""
    manifest = spec.build_mpijob(settings(8, 4, env={"NCCL_SOCKET_IFNAME": ifname}))
    command = container(manifest, "Launcher")["command"]
    assert command[0] == "horovodrun"
    found = command[command.index("--network-interfaces"):command.index("--network-interfaces") + 2] \
        if "--network-interfaces" in command else []
    assert found == option
    torch_command = container(spec.build_mpijob(settings(8, 4, backend="torch", env={"NCCL_SOCKET_IFNAME": ifname})),
                              "Launcher")["command"]
    assert "--network-interfaces" not in torch_command and "NCCL_SOCKET_IFNAME" in torch_command  # mpirun -x


def test_an_unresolved_backend_is_refused():
    with pytest.raises(ConfigError, match="backend='auto' should be horovod or torch"):
        settings(backend="auto")
