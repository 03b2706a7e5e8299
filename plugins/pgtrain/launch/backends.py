"""Which collectives a job's ranks use (``trainer.collectives``), as the launchers resolve the author's ``backend``.

``auto`` is ``horovod`` where Horovod with its PyTorch extension is installed in the ranks' environment, else
``torch`` (torch.distributed needs nothing compiled: a plain ``pip install "pgtrain[local]"`` trains). The local
launcher asks the ranks' own Python (their PYTHONPATH included), without importing torch there: ``import horovod``
and the extension's file, a few tens of milliseconds instead of the seconds of ``import horovod.torch``. On
Kubernetes the ranks' environment is the image, which the launcher cannot look into before the job starts:
``auto`` is ``horovod`` there, as pgtrain's image builds it (set ``backend: torch`` for an image without it).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

from pgtrain.config.params import BACKENDS

# Exit 0: Horovod and its PyTorch extension are there; else the reason on stderr.
_PROBE = """
import pathlib, sys
try:
    import horovod
except Exception as error:
    sys.exit(f"import horovod failed: {type(error).__name__}: {error}")
folder = pathlib.Path(horovod.__file__).parent / "torch"
if not any(folder.glob("mpi_lib_v2*")):
    sys.exit(f"horovod {getattr(horovod, '__version__', '?')} has no PyTorch extension in {folder}")
"""
PROBE_TIMEOUT_SECONDS = 60


def horovod_installed(python: str, environment: Mapping[str, str]) -> tuple[bool, str]:
    """(whether ``python`` with ``environment`` has Horovod's PyTorch extension, why not)."""
    try:
        probe = subprocess.run([python, "-c", _PROBE], env=dict(environment), capture_output=True, text=True,
                               timeout=PROBE_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"the probe of Horovod failed: {error}"
    lines = probe.stderr.strip().splitlines()
    return probe.returncode == 0, lines[-1] if lines else f"exit status {probe.returncode}"


def resolve(backend: str, python: str, environment: Mapping[str, str]) -> tuple[str, str]:
    """(``horovod`` or ``torch``, a sentence saying why) for the author's ``backend`` in the ranks' environment."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend, f"backend: {backend} (the author's setting)"
    found, why_not = horovod_installed(python, environment)
    if found:
        return "horovod", "backend: auto chose horovod (Horovod's PyTorch extension is installed)"
    return "torch", f"backend: auto chose torch (torch.distributed): no usable Horovod ({why_not})"


def kubernetes_backend(backend: str) -> str:
    """The MPIJob's backend: ``auto`` is the image's Horovod (see the module's doc)."""
    return "horovod" if backend == "auto" else backend
