"""docker-compose.yaml cannot run here (no Docker engine): check its structure and that it holds no secrets."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.conftest import REPO

COMPOSE = yaml.safe_load((REPO / "docker-compose.yaml").read_text())


def test_compose_has_the_airflow_3_stack():
    services = COMPOSE["services"]
    assert {"postgres", "airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
            "airflow-triggerer"} <= set(services)
    for name, service in services.items():
        if name.startswith("airflow"):
            mounts = {volume.split(":")[1] for volume in service["volumes"]}
            assert {"/opt/airflow/dags", "/opt/airflow/plugins", "/opt/airflow/sql"} <= mounts, name
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
    assert "requirements-dev" not in dockerfile and "/opt/pgtrain/requirements.txt" in dockerfile
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in dockerfile  # pip may never move the image's Airflow
    assert "FROM apache/airflow:${AIRFLOW_VERSION}-python3.11" in dockerfile
    for name in ("pytest", "ruff", "selenium"):
        assert name not in (REPO / "requirements.txt").read_text(), name


def test_the_plugins_folder_holds_the_models_page_and_not_the_library():
    """Airflow loads every .py file of the plugins folder as a plugin module: registration files, not the library."""
    from airflow._shared.module_loading.file_discovery import find_path_from_directory

    found = [p for p in find_path_from_directory(str(REPO / "plugins"), ".airflowignore") if p.endswith(".py")]
    assert "pgtrain_plugin.py" in [p.rsplit("/", 1)[1] for p in found]
    assert not [p for p in found if "/plugins/pgtrain/" in p], "library modules loaded as plugins"
    assert "triggerer" in COMPOSE["services"]["airflow-triggerer"]["command"]
