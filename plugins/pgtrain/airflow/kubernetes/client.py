"""Every Kubernetes API call of the MPIJob operator (``MPIJobClient``, on the provider's ``KubernetesHook``) and of
its deferrable trigger (``AsyncMPIJobClient``, on ``AsyncKubernetesHook``): the same calls, in one place.

The operator and the trigger decide; these clients only talk to the API server (as the cncf-kubernetes provider's
``CustomObjectLauncher`` does for ``SparkKubernetesOperator``). Transient API errors are retried with
the provider's ``generic_api_retry``; a 404 on reading one MPIJob means "gone" and is returned as None, while a 404
that names no object (the list, or a read when the resource type is not served) means the MPI Operator's CRD is
missing and raises ``errors.MPIOperatorMissing``. Events are read only for the pods ``watch.pods_to_explain``
names, one field-selected list per pod.
"""

from __future__ import annotations

import json
from typing import Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import generic_api_retry
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from kubernetes.client import V1DeleteOptions, V1Pod
from kubernetes.client.exceptions import ApiException

from pgtrain.airflow.kubernetes import errors
from pgtrain.launch.mpijob import api, watch


def pods_of(name: str) -> str:
    """The label selector of an MPIJob's pods (the MPI Operator labels them)."""
    return f"{api.JOB_NAME_LABEL}={name}"


def events_of(pod_name: str) -> str:
    """The field selector of one pod's events (field selectors have no set-based form)."""
    return f"involvedObject.kind=Pod,involvedObject.name={pod_name}"


def names_an_object(body: Any) -> bool:
    """A 404's ``Status`` says which object is not found (``details.name``): the resource type exists. A 404 for
    a resource type the server does not serve names none ("the server could not find the requested resource")."""
    try:
        status = json.loads(body) if isinstance(body, str | bytes) else body
    except ValueError:
        return False
    return isinstance(status, dict) and bool((status.get("details") or {}).get("name"))


def _resource() -> dict[str, str]:
    return {"group": api.API_GROUP, "version": api.API_VERSION, "plural": api.PLURAL}


def absent_job(exc: Exception) -> None:
    """A failed read of one MPIJob (either client's ApiException): None when the job does not exist; raises
    ``errors.MPIOperatorMissing`` when MPIJobs are not served at all (a 404 naming no object), else ``exc``."""
    if getattr(exc, "status", None) == 404:
        if names_an_object(getattr(exc, "body", None)):
            return None
        raise errors.mpi_operator_missing() from exc
    raise exc


class MPIJobClient:
    def __init__(self, hook: KubernetesHook, namespace: str) -> None:
        self.hook = hook
        self.namespace = namespace

    def _call(self, method: str, *, retry: bool = True, **kwargs: Any) -> Any:
        def call() -> Any:
            return getattr(self.hook.custom_object_client, method)(**_resource(), namespace=self.namespace, **kwargs)

        return generic_api_retry(call)() if retry else call()

    def get(self, name: str) -> dict[str, Any] | None:
        """The MPIJob, or None when it does not exist."""
        try:
            return self._call("get_namespaced_custom_object", name=name)
        except ApiException as exc:
            return absent_job(exc)

    def list(self, label_selector: str) -> list[dict[str, Any]]:
        try:
            return self._call("list_namespaced_custom_object", label_selector=label_selector)["items"]
        except ApiException as exc:
            if exc.status == 404:  # listing a served resource type never answers 404
                raise errors.mpi_operator_missing() from exc
            raise

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create once (never retried: a retry after a lost response would meet a 409)."""
        return self._call("create_namespaced_custom_object", retry=False, body=manifest)

    def delete(self, name: str, grace_period_seconds: int | None = None) -> bool:
        """Delete with foreground propagation (the MPIJob goes once its pods are gone); False if already gone."""
        options = V1DeleteOptions(propagation_policy="Foreground", grace_period_seconds=grace_period_seconds)
        try:
            self._call("delete_namespaced_custom_object", name=name, body=options)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def label(self, name: str, labels: dict[str, str]) -> None:
        self._call("patch_namespaced_custom_object", name=name, body={"metadata": {"labels": labels}})

    def pods(self, name: str, role: str | None = None) -> list[V1Pod]:
        """The job's pods (launcher, worker, or both)."""
        selector = pods_of(name) + (f",{api.JOB_ROLE_LABEL}={role}" if role else "")
        return generic_api_retry(self.hook.core_v1_client.list_namespaced_pod)(
            self.namespace, label_selector=selector).items

    def pod_dicts(self, name: str) -> list[dict[str, Any]]:
        """The job's pods in API form, as ``watch.watch_step`` reads them."""
        return [PodGenerator.serialize_pod(pod) for pod in self.pods(name)]

    def pod_events(self, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The events of those of these (API-form) pods whose events may explain why they wait (a missing Secret
        volume shows only there), in API form; none for running or unscheduled pods."""
        events = []
        for pod_name in watch.pods_to_explain(pods):
            listed = generic_api_retry(self.hook.core_v1_client.list_namespaced_event)(
                self.namespace, field_selector=events_of(pod_name))
            events += self.hook.core_v1_client.api_client.sanitize_for_serialization(listed)["items"]
        return events

    def launcher_pod(self, name: str) -> V1Pod | None:
        """The newest launcher pod (with backoffLimit > 0 the launcher Job may have made several)."""
        return max(self.pods(name, "launcher"), key=lambda p: p.metadata.creation_timestamp, default=None)


class AsyncMPIJobClient:
    """The calls the deferrable trigger makes, on one ``kubernetes_asyncio`` API client (``AsyncKubernetesHook``)."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

        self.api_client = api_client
        self.namespace = namespace
        self.custom = CustomObjectsApi(api_client)
        self.core = CoreV1Api(api_client)

    async def get(self, name: str) -> dict[str, Any] | None:
        """The MPIJob, or None when it does not exist (``errors.MPIOperatorMissing`` when MPIJobs are not served)."""
        from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException

        try:
            return await self.custom.get_namespaced_custom_object(**_resource(), namespace=self.namespace, name=name)
        except AsyncApiException as exc:
            return absent_job(exc)

    async def pods_and_events(self, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The job's pods and the events of those that may explain why they wait, in API form (what
        ``watch_step`` reads before the job runs)."""
        listed = await self.core.list_namespaced_pod(self.namespace, label_selector=pods_of(name))
        pods = self.api_client.sanitize_for_serialization(listed)["items"]
        events = []
        for pod_name in watch.pods_to_explain(pods):
            listed = await self.core.list_namespaced_event(self.namespace, field_selector=events_of(pod_name))
            events += self.api_client.sanitize_for_serialization(listed)["items"]
        return pods, events

    async def delete(self, name: str) -> bool:
        """Delete with foreground propagation; False if already gone."""
        from kubernetes_asyncio.client import V1DeleteOptions
        from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException

        try:
            await self.custom.delete_namespaced_custom_object(
                **_resource(), namespace=self.namespace, name=name,
                body=V1DeleteOptions(propagation_policy="Foreground"))
        except AsyncApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True


def container_started(pod: V1Pod) -> bool:
    """The pod's container has run (it is running, or has ended)."""
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.state and (status.state.running or status.state.terminated):
            return True
    return False
