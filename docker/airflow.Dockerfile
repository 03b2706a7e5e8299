# Airflow 3 with pgtrain and the local (CPU) launcher: torch, Horovod (built by the same script as .venv).
# The official image already holds Airflow installed with Airflow's constraints; on top of it go the runtime
# requirements only (requirements.txt: the pgtrain package with its airflow and local extras, no test tools),
# with apache-airflow pinned to the image's version so that pip can never move it (what Airflow's constraints
# files ask of later pip commands). Installing the package is what registers pgtrain's Airflow plugins (the
# models page, the run-notes listener): its airflow.plugins entry points; the plugins folder holds none.
ARG AIRFLOW_VERSION=3.3.2
FROM apache/airflow:${AIRFLOW_VERSION}-python3.11
ARG AIRFLOW_VERSION
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /opt/pgtrain \
    && chown airflow:0 /opt/pgtrain
USER airflow
WORKDIR /opt/pgtrain
COPY --chown=airflow:0 pyproject.toml requirements.txt constraints.txt ./
COPY --chown=airflow:0 trainer_image/build_horovod.sh trainer_image/
# torch: the CPU wheel of the version constraints.txt pins. Horovod's own run-time dependencies (pyproject.toml's
# trainer extra, as the image's Airflow constraints allow them) go first: the Horovod build needs them.
# This layer comes before the sources so that editing them does not rebuild Horovod.
RUN torch_version="$(sed -n 's/^torch==\([0-9.]*\).*/\1/p' constraints.txt)" \
    && test -n "$torch_version" \
    && pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==${torch_version}" \
    && pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" cloudpickle psutil pyyaml packaging cffi \
    && bash trainer_image/build_horovod.sh python /tmp/wheels \
    && pip install --no-cache-dir --no-deps /tmp/wheels/*/horovod-*.whl \
    && rm -rf /tmp/wheels
# The package itself (pgtrain with its migrations, the trainer, their entry points) and the rest of its pins.
COPY --chown=airflow:0 plugins/pgtrain plugins/pgtrain
COPY --chown=airflow:0 trainer_image/trainer trainer_image/trainer
COPY --chown=airflow:0 sql sql
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /opt/pgtrain/requirements.txt \
    && rm -rf build pgtrain.egg-info \
    && python -c "from importlib.metadata import entry_points as e; assert len(e(group='airflow.plugins', module='pgtrain.airflow.plugins')) == 2"
# docker-compose.yaml mounts the repository's plugins/ and trainer_image/ here: first on the path, the mounted
# sources win over the installed copy (whose metadata still names the entry points), so edits need no rebuild.
ENV PYTHONPATH=/opt/pgtrain/plugins:/opt/pgtrain/trainer_image \
    PGTRAIN_SQL_DIR=/opt/airflow/sql
