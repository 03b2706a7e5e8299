"""The collectives' pure parts: where a torch rank finds its place and rendezvous, how the launchers resolve the
author's backend, and the local torch launcher stopping every rank once one fails."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.config.settings import AuthorSettings, load_settings
from pgtrain.core.errors import ConfigError
from pgtrain.launch import backends, ranks
from pgtrain.launch.local import local_command
from trainer.collectives.torch_distributed import DEFAULT_PORT, first_host, place


def test_a_torch_rank_under_mpirun_takes_its_place_from_open_mpi_and_the_hostfile(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# the MPI Operator's\njob-worker-0.job.ns.svc slots=4\njob-worker-1.job.ns.svc slots=4\n")
    environ = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "PGTRAIN_HOSTFILE": str(hostfile)}
    where = place(environ)
    assert (where.rank, where.size, where.local_rank, where.local_size) == (5, 8, 1, 4)
    assert (where.address, where.port) == ("job-worker-0.job.ns.svc", DEFAULT_PORT)
    # The local launcher's (and torchrun's) variables come first.
    local = place({**environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4242"})
    assert (local.rank, local.size, local.address, local.port) == (1, 2, "127.0.0.1", 4242)


def test_a_torch_rank_without_a_place_or_a_rendezvous_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="start it with RANK and WORLD_SIZE set"):
        place({})
    with pytest.raises(ConfigError, match="no rendezvous address: neither MASTER_ADDR nor a host in"):
        place({"RANK": "0", "WORLD_SIZE": "2", "PGTRAIN_HOSTFILE": str(tmp_path / "missing")})
    assert first_host(str(tmp_path / "missing")) is None


def test_auto_picks_horovod_where_its_torch_extension_is_installed_and_torch_otherwise(tmp_path):
    environment = dict(os.environ)
    assert backends.resolve("auto", sys.executable, environment)[0] == "horovod"  # .venv builds it
    shim = tmp_path / "horovod"
    shim.mkdir()
    (shim / "__init__.py").write_text("__version__ = 'shim'\n")  # importable, without its PyTorch extension
    chosen, why = backends.resolve("auto", sys.executable,
                                   {**environment, "PYTHONPATH": os.pathsep.join([str(tmp_path),
                                                                                  environment.get("PYTHONPATH", "")])})
    assert chosen == "torch" and "horovod shim has no PyTorch extension" in why
    assert backends.resolve("torch", sys.executable, environment) == ("torch",
                                                                      "backend: torch (the author's setting)")
    assert backends.kubernetes_backend("auto") == "horovod" and backends.kubernetes_backend("torch") == "torch"


def test_the_local_torch_command_starts_ranks_without_horovodrun():
    command = local_command("d/r", 2, 4, "torch", 30)
    assert command[:4] == [sys.executable, "-m", "pgtrain.launch.ranks", "2"]
    assert command[4:] == [sys.executable, "-m", "trainer", "--backend", "torch", "--collective-timeout", "30",
                           "--run-id", "d/r", "--attempt", "4"]
    assert "horovodrun" not in " ".join(command)


def test_one_failed_rank_stops_the_others_and_its_status_is_the_job_s(tmp_path):
    """Rank 1 exits 3 at once; rank 0 would sleep for minutes: it is stopped, and the job's status is rank 1's."""
    script = ("import os, sys, time\n"
              f"open(os.path.join({str(tmp_path)!r}, os.environ['RANK']), 'w').write(os.environ['MASTER_PORT'])\n"
              "sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(300)\n")
    started = time.monotonic()
    assert ranks.run_ranks(2, [sys.executable, "-c", script]) == 3
    assert time.monotonic() - started < 120  # generous: not the 300 s rank 0 would sleep
    assert (tmp_path / "0").read_text() == (tmp_path / "1").read_text()  # one rendezvous port for all
    assert ranks.run_ranks(2, [sys.executable, "-c", "pass"]) == 0
    assert ranks.exit_status(-9) == 137


def test_backend_and_collective_timeout_are_the_author_s_settings(tmp_path):
    path = tmp_path / "pgtrain.yaml"
    path.write_text("backend: torch\ncollective_timeout: 60\n")
    settings = load_settings(path)
    assert settings.fixed_params() == {"launcher": "local", "backend": "torch", "collective_timeout": 60,
                                       "precision": "fp32", "stall_timeout": TrainingConfig().stall_timeout}
    assert AuthorSettings().fixed_params()["backend"] == TrainingConfig().backend == "auto"
    path.write_text("backend: mpi\n")
    with pytest.raises(ConfigError, match="backend: 'mpi' is not one of"):
        load_settings(path)


def test_the_mpijob_launcher_hands_the_hostfile_s_first_host_to_the_ranks(tmp_path):
    """The MPI Operator mounts the hostfile in the launcher pod only: the launcher reads it and sets MASTER_ADDR,
    which mpirun -x passes to the ranks on the workers (unless the author's environment set one)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-worker-0.job.ns.svc slots=4\njob-worker-1.job.ns.svc slots=4\n")
    show = [sys.executable, "-c", "import os; print(os.environ['MASTER_ADDR'])"]
    environ = {k: v for k, v in os.environ.items() if k != "MASTER_ADDR"}

    def launch(env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pgtrain.launch.mpijob.rendezvous", *show], env=env,
                              capture_output=True, text=True, timeout=120)

    found = launch({**environ, "OMPI_MCA_orte_default_hostfile": str(hostfile)})
    assert (found.returncode, found.stdout.strip()) == (0, "job-worker-0.job.ns.svc")
    chosen = launch({**environ, "OMPI_MCA_orte_default_hostfile": str(hostfile), "MASTER_ADDR": "10.0.0.7"})
    assert chosen.stdout.strip() == "10.0.0.7"
    missing = launch({**environ, "OMPI_MCA_orte_default_hostfile": str(tmp_path / "none")})
    assert missing.returncode == 2 and "found no host in" in missing.stderr and "launcher" in missing.stderr
