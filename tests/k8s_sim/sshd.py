"""Test double: the simulated cluster's pod network for ``mpirun``: the workers' sshd, and the cluster DNS.

A real MPIJob's launcher reaches its workers by the names in the MPI Operator's hostfile
(``<job>-worker-<i>.<job>-worker.<namespace>.svc``, through the workers' headless Service) and starts Open MPI's
``orted`` there over ssh (``/usr/sbin/sshd -De -p PORT`` is the worker container's command). Here every pod is a
directory on this machine:

- DNS: each running worker's name resolves to a loopback address of its own (``127.1.x.y``: Open MPI treats the
  hosts as remote, connections still stay on this machine). Processes of the simulated pods resolve through
  nss_wrapper (``LD_PRELOAD``, ``NSS_WRAPPER_HOSTS``: Debian's libnss-wrapper) and this cluster's hosts file; other
  names resolve as usual.
- sshd: ``python -m k8s_sim.sshd STATE_DIR [ssh options] HOST COMMAND...`` is the launcher's ssh client
  (the kubelet points Open MPI's ``plm_rsh_agent`` at it). It refuses a host that does not resolve or a port the
  worker's sshd does not listen on, as ssh would, and runs the command as a login on the worker: ``sh -c COMMAND``
  in the worker's home with an sshd session's environment, not the container's (sshd starts sessions with its own;
  what the ranks need of the pod's, mpirun passes with ``-x``), plus what the simulated image holds (its Python
  path) and the cluster DNS.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import sys
from pathlib import Path

SSH_DEFAULT_PORT = 22
SESSION_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/games"  # Debian's sshd gives sessions this PATH
# ssh(1) options that take a value (-p PORT, -o OPTION, ...); the others are flags.
_WITH_VALUE = set("BbcDEeFIiJLlmOoPpQRSWw")


def nss_wrapper() -> str | None:
    """The nss_wrapper library the simulated pods resolve names through (None: not installed, `make mpi`)."""
    return ctypes.util.find_library("nss_wrapper")


def dns_env(state_dir: Path) -> dict[str, str]:
    """What a simulated pod's processes need to resolve the cluster's names (empty without nss_wrapper)."""
    library = nss_wrapper()
    return {"LD_PRELOAD": library, "NSS_WRAPPER_HOSTS": str(hosts_file(state_dir))} if library else {}


def hosts_file(state_dir: Path) -> Path:
    return state_dir / "dns" / "hosts"


def client(state_dir: Path) -> Path:
    """An executable ssh client for Open MPI's plm_rsh_agent (a path, no arguments): this module's ``main``."""
    path = state_dir / "bin" / "ssh"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        package_parent = Path(__file__).resolve().parents[1]
        path.write_text(f'#!/bin/sh\nPYTHONPATH="{package_parent}" exec "{sys.executable}" -m k8s_sim.sshd '
                        f'"{state_dir}" "$@"\n')
        path.chmod(0o755)
    return path


def serve(state_dir: Path, fqdn: str, address: str, port: int | None, home: Path, env: dict[str, str]) -> None:
    """A running worker: ``fqdn`` resolves to ``address``; its sshd (None: the container runs none) takes logins
    on ``port`` into ``home`` with ``env``."""
    hosts = hosts_file(state_dir)
    hosts.parent.mkdir(parents=True, exist_ok=True)
    with open(hosts, "a") as file:
        # And as IPv4-mapped IPv6 (the same loopback address): nss_wrapper answers an IPv6 lookup of an IPv4-only
        # name with EAI_ADDRFAMILY, which torch's c10d client retries until its timeout instead of trying IPv4.
        file.write(f"{address} {fqdn}\n::ffff:{address} {fqdn}\n")
    session = state_dir / "sshd" / f"{fqdn}.json"
    session.parent.mkdir(parents=True, exist_ok=True)
    session.write_text(json.dumps({"port": port, "home": str(home), "env": env}))


def session_env(home: Path, image_env: dict[str, str]) -> dict[str, str]:
    """An sshd login's environment (root's, as the MPI Operator's default mode) and the image's own."""
    return {"HOME": str(home), "USER": "root", "LOGNAME": "root", "SHELL": "/bin/sh", "PATH": SESSION_PATH,
            **image_env}


def worker_port(command: list[str]) -> int | None:
    """The port the container's sshd listens on (None: its command is no sshd)."""
    if not command or Path(command[0]).name != "sshd":
        return None
    return int(command[command.index("-p") + 1]) if "-p" in command[:-1] else SSH_DEFAULT_PORT


def main(argv: list[str]) -> int:
    state_dir, args = Path(argv[0]), argv[1:]
    port, i = SSH_DEFAULT_PORT, 0
    while i < len(args) and args[i].startswith("-"):
        flag = args[i]
        value = None
        if flag[1:2] in _WITH_VALUE:
            value, i = (flag[2:], i + 1) if len(flag) > 2 else (args[i + 1], i + 2)
        else:
            i += 1
        if flag.startswith("-p") and value is not None:
            port = int(value)
    if i >= len(args):
        print("usage: ssh [options] destination [command]", file=sys.stderr)
        return 255
    host, command = args[i].rpartition("@")[2], " ".join(args[i + 1:])
    session_file = state_dir / "sshd" / f"{host}.json"
    if not session_file.exists():
        print(f"ssh: Could not resolve hostname {host}: Name or service not known", file=sys.stderr)
        return 255
    session = json.loads(session_file.read_text())
    if session["port"] != port:
        print(f"ssh: connect to host {host} port {port}: Connection refused", file=sys.stderr)
        return 255
    with open(state_dir / "sshd" / f"{host}.log", "a") as log:  # as sshd's "Accepted publickey for root"
        log.write(f"login: {command}\n")
    os.chdir(session["home"])
    os.execve("/bin/sh", ["sh", "-c", command] if command else ["sh"], session["env"])
    return 255  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
