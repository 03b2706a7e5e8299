"""Every Kubernetes API call of the MPIJob operator (``MPIJobClient``, on the provider's ``KubernetesHook``) and of
its deferrable trigger (``AsyncMPIJobClient``, on ``AsyncKubernetesHook``): the same calls, in one place.

The operator and the trigger decide; these clients only talk to the API server (as the cncf-kubernetes provider's
``CustomObjectLauncher`` does for ``SparkKubernetesOperator``). Transient API errors are retried with
the provider's ``generic_api_retry``; a 404 on a read means "gone" and is returned as None.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import generic_api_retry
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from kubernetes.client import V1DeleteOptions, V1Pod
from kubernetes.client.exceptions import ApiException

from pgtrain.launch.mpijob import api

POD_EVENTS = "involvedObject.kind=Pod"


def pods_of(name: str) -> str:
    """The label selector of an MPIJob's pods (the MPI Operator labels them)."""
    return f"{api.JOB_NAME_LABEL}={name}"


def events_of(pods: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events (API form) about these pods."""
    names = {pod["metadata"]["name"] for pod in pods}
    return [e for e in events if (e.get("involvedObject") or {}).get("name") in names]


def _resource() -> dict[str, str]:
    return {"group": api.API_GROUP, "version": api.API_VERSION, "plural": api.PLURAL}


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
            if exc.status == 404:
                return None
            raise

    def list(self, label_selector: str) -> list[dict[str, Any]]:
        return self._call("list_namespaced_custom_object", label_selector=label_selector)["items"]

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
        """The events of these (API-form) pods, in API form: a missing Secret volume shows only there."""
        if not pods:
            return []
        listed = generic_api_retry(self.hook.core_v1_client.list_namespaced_event)(
            self.namespace, field_selector=POD_EVENTS)
        return events_of(pods, self.hook.core_v1_client.api_client.sanitize_for_serialization(listed)["items"])

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

    async def get(self, name: str) -> dict[str, Any]:
        return await self.custom.get_namespaced_custom_object(**_resource(), namespace=self.namespace, name=name)

    async def pods_and_events(self, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The job's pods and their events, in API form (what ``watch_step`` reads before the job runs)."""
        listed = await self.core.list_namespaced_pod(self.namespace, label_selector=pods_of(name))
        pods = self.api_client.sanitize_for_serialization(listed)["items"]
        listed = await self.core.list_namespaced_event(self.namespace, field_selector=POD_EVENTS)
        return pods, events_of(pods, self.api_client.sanitize_for_serialization(listed)["items"])

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
