"""What must not outlive its process: the local launcher's horovodrun, every trainer rank, the ranks' passfile.

Linux's PR_SET_PDEATHSIG delivers a signal to a process when the thread that started it dies, however
it dies (SIGKILL included); elsewhere these helpers do nothing. A memfd is a file on no disk: the kernel
frees it when the last process holding it exits, SIGKILL included.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Iterator

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    return ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """This process gets ``sig`` when its parent dies; True when that is set up (and the parent is alive)."""
    prctl = _prctl()
    if prctl is None:
        return False
    parent = os.getppid()
    if prctl(_PR_SET_PDEATHSIG, int(sig)) != 0:
        return False
    if os.getppid() != parent:  # the parent died while this was set up: nobody will signal
        os.kill(os.getpid(), sig)
    return True


def preexec_die_with_this_process(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for subprocess.Popen: the child gets ``sig`` when the calling thread dies."""
    prctl = _prctl()  # resolved before the fork: between fork and exec the child only calls it and getppid
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


@contextlib.contextmanager
def memory_file(name: str, content: bytes) -> Iterator[int | None]:
    """A descriptor of a file holding ``content`` (mode 0600) that no path on disk names, closed on exit
    (close-on-exec: pass it on with ``pass_fds``); it is gone once every process holding it has exited. None where
    there are no memfds."""
    if not hasattr(os, "memfd_create"):
        yield None
        return
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, content)
        yield fd
    finally:
        os.close(fd)
