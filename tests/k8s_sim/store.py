"""Test double: the simulated API server's object store (namespaced objects, label selectors, history)."""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import threading
import uuid
from typing import Any


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_precise() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(Exception):
    """Becomes a Kubernetes ``Status`` response."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


def not_found(resource: str, name: str) -> ApiError:
    """An object that does not exist: the API server's Status names it in ``details`` (a resource type it does
    not serve gets a 404 naming nothing)."""
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})


def parse_selector(selector: str | None) -> list[tuple[str, str, str | None]]:
    """``a=b,c!=d,e,!f`` -> [(op, key, value)]; the subset of label selectors clients here send."""
    terms = []
    for raw in (selector or "").split(","):
        term = raw.strip()
        if not term:
            continue
        if term.startswith("!"):
            terms.append(("absent", term[1:], None))
        elif "!=" in term:
            key, value = term.split("!=", 1)
            terms.append(("ne", key.strip(), value.strip()))
        elif "==" in term or "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            terms.append(("eq", key.strip(), value.strip()))
        else:
            terms.append(("present", term, None))
    return terms


def matches(labels: dict[str, str] | None, selector: str | None) -> bool:
    labels = labels or {}
    for op, key, value in parse_selector(selector):
        if op == "eq" and labels.get(key) != value:
            return False
        if op == "ne" and labels.get(key) == value:
            return False
        if op == "present" and key not in labels:
            return False
        if op == "absent" and key in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class Store:
    """All objects of the simulated cluster, keyed by (resource, namespace, name); thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.history: list[dict[str, Any]] = []
        self._versions = itertools.count(1)

    def record(self, verb: str, resource: str, namespace: str, name: str, **extra: Any) -> None:
        with self.lock:
            self.history.append({"verb": verb, "resource": resource, "namespace": namespace, "name": name,
                                 "time": now_precise(), **extra})

    def create(self, resource: str, namespace: str, obj: dict[str, Any], *, actor: str = "client") -> dict:
        with self.lock:
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            name = meta.get("name")
            if not name:
                raise ApiError(422, "Invalid", f"{resource}: metadata.name is required")
            key = (resource, namespace, name)
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists')
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now(),
                        resourceVersion=str(next(self._versions)), generation=1)
            meta.setdefault("labels", {})
            self.objects[key] = obj
            self.record("create", resource, namespace, name, actor=actor)
            return copy.deepcopy(obj)

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            obj = self.objects.get((resource, namespace, name))
            if obj is None:
                raise not_found(resource, name)
            return copy.deepcopy(obj)

    def list(self, resource: str, namespace: str | None, selector: str | None = None) -> list[dict]:
        with self.lock:
            return [copy.deepcopy(o) for (r, ns, _), o in sorted(self.objects.items())
                    if r == resource and (namespace is None or ns == namespace)
                    and matches(o["metadata"].get("labels"), selector)]

    def update(self, resource: str, namespace: str, name: str, mutate, *, verb: str | None = None,
               actor: str = "controller", **extra: Any) -> dict:
        """Apply ``mutate(obj)`` in place under the lock; bumps resourceVersion."""
        with self.lock:
            obj = self.objects.get((resource, namespace, name))
            if obj is None:
                raise not_found(resource, name)
            mutate(obj)
            obj["metadata"]["resourceVersion"] = str(next(self._versions))
            if verb:
                self.record(verb, resource, namespace, name, actor=actor, **extra)
            return copy.deepcopy(obj)

    def remove(self, resource: str, namespace: str, name: str, *, actor: str = "controller",
               **extra: Any) -> None:
        with self.lock:
            if self.objects.pop((resource, namespace, name), None) is not None:
                self.record("remove", resource, namespace, name, actor=actor, **extra)
