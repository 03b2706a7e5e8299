"""docker-compose.yaml cannot run here (no Docker engine): check its structure and that it holds no secrets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import yaml

from tests.conftest import REPO
from tests.unit.test_trainer_image import DEV_ONLY, PROJECT, pulled_in, requirement_lines

COMPOSE = yaml.safe_load((REPO / "docker-compose.yaml").read_text())


def test_compose_has_the_airflow_3_stack():
    services = COMPOSE["services"]
    assert {"postgres", "airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
            "airflow-triggerer"} <= set(services)
    for name, service in services.items():
        if name.startswith("airflow"):
            mounts = {volume.split(":")[1] for volume in service["volumes"]}
            assert {"/opt/airflow/dags", "/opt/pgtrain/plugins", "/opt/airflow/sql"} <= mounts, name
            assert "AIRFLOW_CONN_PGTRAIN_DB" in service["environment"], name
            # a shared signing key: without it each service makes its own and task tokens are rejected
            assert service["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"].startswith("${"), name
    dockerfile = REPO / services["airflow-scheduler"]["build"]["dockerfile"]
    assert "build_horovod.sh" in dockerfile.read_text()


def test_compose_takes_every_password_from_the_environment():
    text = (REPO / "docker-compose.yaml").read_text()
    for match in re.finditer(r"(?im)^\s*(\w*password\w*):\s*(\S+)", text):
        assert match.group(2).startswith("${"), f"literal secret for {match.group(1)}"
    for url in re.findall(r"postgresql(?:\+\w+)?://[^\s]+", text):
        assert ":${" in url, f"URL with a literal password: {url}"


def test_compose_file_follows_the_compose_specification():
    """No Docker engine here: the file is checked against the compose spec's JSON schema (vendored by
    check-jsonschema, no download)."""
    check = REPO / ".venv" / "bin" / "check-jsonschema"
    result = subprocess.run([str(check), "--builtin-schema", "vendor.compose-spec", str(REPO / "docker-compose.yaml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_long_running_service_has_a_health_check_and_restarts():
    services = COMPOSE["services"]
    for name in ("postgres", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        assert services[name].get("healthcheck", {}).get("test"), name
        assert services[name].get("restart") == "always", name
    assert services["airflow-init"]["restart"] == "no"
    environment = services["airflow-scheduler"]["environment"]
    assert environment["AIRFLOW__CORE__FERNET_KEY"].startswith("${")
    assert "AIRFLOW_FERNET_KEY=" in (REPO / ".env.example").read_text()


def test_the_image_installs_the_runtime_requirements_only_with_airflow_pinned():
    dockerfile = (REPO / COMPOSE["services"]["airflow-apiserver"]["build"]["dockerfile"]).read_text()
    assert "requirements-dev" not in dockerfile and "-r /opt/pgtrain/requirements.txt" in dockerfile
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in dockerfile  # pip may never move the image's Airflow
    assert "FROM apache/airflow:${AIRFLOW_VERSION}-python3.11" in dockerfile
    # the package is installed (its entry points register the plugins), with the sources pyproject.toml names
    for source in ("pyproject.toml", "plugins/pgtrain", "trainer_image/trainer"):
        assert re.search(rf"^COPY .*\b{re.escape(source)}\b", dockerfile, re.MULTILINE), source
    assert not re.search(r"torch==\d", dockerfile)  # the version is read from constraints.txt
    assert [(r.name, r.extras) for r in requirement_lines(REPO / "requirements.txt")] == \
        [(PROJECT["name"], {"airflow", "local"})]
    runtime = pulled_in(requirement_lines(REPO / "requirements.txt"))
    assert {"apache-airflow", "apache-airflow-providers-cncf-kubernetes", "torch", "psycopg"} <= runtime
    assert not runtime & DEV_ONLY, sorted(runtime & DEV_ONLY)


def test_every_version_has_one_home_in_the_constraints():
    """pyproject.toml declares ranges (the package installs into an existing Airflow); the tested versions are
    pinned once, in constraints.txt, and satisfy those ranges. The requirements files name the package with
    extras; the dev install has the runtime's, plus the tests' tools, the embedded PostgreSQL and the examples'
    data."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    declared = [Requirement(r) for r in PROJECT["dependencies"]] + [
        Requirement(r) for extra in PROJECT["optional-dependencies"].values() for r in extra]
    assert not [str(r) for r in declared if any(s.operator == "==" for s in r.specifier)], "exact pins in pyproject"
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(requirement.name)] = spec.version
    for requirement in declared:
        name = canonicalize_name(requirement.name)
        if name != canonicalize_name(PROJECT["name"]):
            assert name in pins, f"{requirement.name} has no tested version in constraints.txt"
            assert requirement.specifier.contains(pins[name], prereleases=True), (str(requirement), pins[name])
    for path in ("requirements.txt", "requirements-dev.txt", "trainer_image/requirements.txt"):
        requirements = requirement_lines(REPO / path)
        assert [r.name for r in requirements] == [PROJECT["name"]] and not requirements[0].specifier, path
    assert [r.extras for r in requirement_lines(REPO / "requirements-dev.txt")] == [{"dev"}]
    assert "-e ." in (REPO / "requirements-dev.txt").read_text()  # the tests import the working tree
    dev = pulled_in(requirement_lines(REPO / "requirements-dev.txt"))
    assert DEV_ONLY <= dev and pulled_in(requirement_lines(REPO / "requirements.txt")) <= dev
    install = re.search(r"^\$\(STAMP\):.*?(?=^\S)", (REPO / "Makefile").read_text(), re.MULTILINE | re.DOTALL).group()
    assert "-c constraints.txt -r requirements-dev.txt" in install and not re.search(r"==\d", install)


def test_airflows_plugins_folder_is_not_the_librarys_sources():
    """Airflow loads every .py file of its plugins folder as a plugin module (a file there too would register a
    pgtrain plugin twice: the package's entry points register them). The repository's plugins/ holds the library's
    sources, so no stack points Airflow there: it would need an .airflowignore, which Task SDK 1.3.2 reads as a
    glob whatever [core] dag_ignore_file_syntax says, with pathspec's deprecated class (a warning in every task
    log)."""
    from dev import devstack

    env = devstack.airflow_environment(REPO, port=8080, metadata_url="postgresql://h/m", training_url="x",
                                       jwt_secret="j", fernet_key="f", extra={})
    assert env.get("AIRFLOW__CORE__PLUGINS_FOLDER") == os.environ.get("AIRFLOW__CORE__PLUGINS_FOLDER")  # not set
    for name, service in COMPOSE["services"].items():
        assert not any(":/opt/airflow/plugins" in volume for volume in service.get("volumes", [])), name
    assert "PLUGINS_FOLDER" not in (REPO / "scripts" / "airflow_env.sh").read_text()
    assert not list((REPO / "plugins").rglob(".airflowignore")), "nothing reads it: no stack scans plugins/"
    assert "triggerer" in COMPOSE["services"]["airflow-triggerer"]["command"]


def test_the_entry_points_register_each_plugin_once_and_cheaply(tmp_path):
    """The installed package's airflow.plugins entry points give Airflow the models page and the run-notes
    listener, once each and without import errors; loading them builds no
    FastAPI app (only the api-server reads fastapi_apps)."""
    entry_points = PROJECT["entry-points"]["airflow.plugins"]
    assert entry_points == {"pgtrain": "pgtrain.airflow.plugins:PgtrainModelsPlugin",
                            "pgtrain_run_notes": "pgtrain.airflow.plugins:PgtrainRunNotesPlugin"}
    probe = (
        "import json, sys\n"
        "from importlib.metadata import entry_points\n"
        "from airflow import plugins_manager\n"
        "plugins_manager.ensure_plugins_loaded()\n"
        "fastapi_at_load = 'fastapi' in sys.modules\n"
        "info = plugins_manager.get_plugin_info(['source', 'listeners', 'fastapi_apps'])\n"
        "print(json.dumps({'installed': sorted(f'{e.name}={e.value}' for e in entry_points(group='airflow.plugins')),\n"
        "                  'plugins': info, 'errors': plugins_manager.get_import_errors(),\n"
        "                  'fastapi_at_load': fastapi_at_load}, default=str))\n"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__LAZY_LOAD_PROVIDERS": "True"}
    result = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert loaded["installed"] == sorted(f"{name}={value}" for name, value in entry_points.items()), \
        "reinstall the package: pip install --no-deps --no-build-isolation -e ."
    plugins = {plugin["name"]: plugin for plugin in loaded["plugins"]}
    assert len(plugins) == len(loaded["plugins"]) and set(plugins) == set(entry_points), loaded
    assert not loaded["errors"] and not loaded["fastapi_at_load"], loaded
    for plugin in plugins.values():
        assert plugin["source"].startswith(f"{PROJECT['name']}=="), plugin  # the entry point, not a file
    assert plugins["pgtrain_run_notes"]["listeners"] == ["pgtrain.airflow.ui.run_notes"]
    assert [app["url_prefix"] for app in plugins["pgtrain"]["fastapi_apps"]] == ["/pgtrain"]  # built when read
