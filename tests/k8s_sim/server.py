"""Test double: the simulated cluster's HTTP API, the subset of the Kubernetes API pgtrain uses.

MPIJobs (``/apis/kubeflow.org/v2beta1``: create, get, list by label, merge-patch, delete with
propagation policy, ``/status``), pods (list by label, get, delete, ``/log`` with follow, since
and tail, streamed with chunked encoding as the real API server does), Secrets (create, get,
delete), events (with involvedObject field selectors). Bearer-token auth as in a kubeconfig. A 404 for a missing
object names it in the Status' ``details``; with ``--without-mpijob-crd`` the kubeflow.org group is not served
(404 naming nothing, as for a CRD never installed). ``/sim/...`` paths are the double's own controls (history of
API calls, reads included; GPU capacity; namespaces whose MPIJobs Kueue queues) and exist in no real cluster.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .controller import GROUP_VERSION, QUEUE_NAME, Cluster
from .store import ApiError, Store, matches, merge_patch, now

CORE = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods|secrets|events)"
                  r"(?:/(?P<name>[^/]+)(?:/(?P<sub>log|status))?)?$")
MPIJOBS = re.compile(r"^/apis/kubeflow\.org/v2beta1/namespaces/(?P<ns>[^/]+)/(?P<res>mpijobs)"
                     r"(?:/(?P<name>[^/]+)(?:/(?P<sub>status))?)?$")
LIST_KINDS = {"pods": ("v1", "PodList"), "secrets": ("v1", "SecretList"), "events": ("v1", "EventList"),
              "mpijobs": (GROUP_VERSION, "MPIJobList")}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SimServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    # --- plumbing ---

    def _send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null") if length else None

    def _dispatch(self, method: str) -> None:
        try:
            if self.headers.get("Authorization") != f"Bearer {self.server.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            body = self._body() if method in ("POST", "PATCH", "PUT", "DELETE") else None
            if url.path.startswith("/sim/"):
                return self._send_json(200, self.server.sim_control(method, url.path, body, query))
            match = CORE.match(url.path) or (self.server.mpijob_crd and MPIJOBS.match(url.path))
            if not match:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource {url.path}")
            ns, resource, name, sub = match["ns"], match["res"], match["name"], match["sub"]
            if sub == "log" and method == "GET":
                return self._stream_log(ns, name, query)
            code = 201 if method == "POST" else 200  # as the API server answers a create
            self._send_json(code, self.server.handle(method, resource, ns, name, query, body))
        except ApiError as exc:
            self._send_json(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib names
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    # --- pods/log ---

    def _stream_log(self, ns: str, name: str, query: dict[str, str]) -> None:
        pod = self.server.store.get("pods", ns, name)
        container = query.get("container") or pod["spec"]["containers"][0]["name"]
        if container not in [c["name"] for c in pod["spec"]["containers"]]:
            raise ApiError(400, "BadRequest", f'container {container} is not valid for pod {name}')
        state = ((pod["status"].get("containerStatuses") or [{}])[0].get("state")) or {}
        if "waiting" in state or not state:
            reason = (state.get("waiting") or {}).get("reason", "ContainerCreating")
            raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        follow = _bool(query.get("follow"))
        timestamps = _bool(query.get("timestamps"))
        since = float(query["sinceSeconds"]) if query.get("sinceSeconds") else None
        tail = int(query["tailLines"]) if query.get("tailLines") else None
        path = self.server.cluster.log_path(ns, name)

        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def emit(lines: list[bytes]) -> None:
            out = []
            for line in lines:
                stamp, _, message = line.partition(b" ")
                if since is not None and _age(stamp) > since:
                    continue
                out.append(line if timestamps else message)
            if out:
                data = b"".join(out)
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        offset, pending = 0, b""
        first = True
        while True:
            data = path.read_bytes()[offset:] if path.exists() else b""
            offset += len(data)
            pending += data
            complete, _, pending = pending.rpartition(b"\n")
            lines = [line + b"\n" for line in complete.split(b"\n")] if complete else []
            if first and tail is not None:
                lines = lines[-tail:] if tail else []
            first = False
            emit(lines)
            if not follow or (not data and self._terminated(ns, name, container)):
                break
            time.sleep(0.1)
        if pending:
            emit([pending + b"\n"])
        self.wfile.write(b"0\r\n\r\n")

    def _terminated(self, ns: str, name: str, container: str) -> bool:
        try:
            pod = self.server.store.get("pods", ns, name)
        except ApiError:
            return True
        for status in pod["status"].get("containerStatuses") or []:
            if status["name"] == container:
                return "terminated" in (status.get("state") or {})
        return True


def _bool(value: str | None) -> bool:
    """Go's strconv.ParseBool, as the API server reads query flags (the Python client sends "True")."""
    return (value or "").lower() in ("1", "t", "true")


def _age(stamp: bytes) -> float:
    try:
        then = dt.datetime.strptime(stamp.decode(), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return 0.0
    return (dt.datetime.now(dt.UTC) - then).total_seconds()


class SimServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: Store, cluster: Cluster, token: str, *,
                 mpijob_crd: bool = True) -> None:
        super().__init__(address, Handler)
        self.store, self.cluster, self.token = store, cluster, token
        self.mpijob_crd = mpijob_crd
        self.queued_namespaces: set[str] = set()

    def handle(self, method: str, resource: str, ns: str, name: str | None, query: dict[str, str],
               body: Any) -> Any:
        store = self.store
        if method == "GET":
            selectors = {k: query[k] for k in ("labelSelector", "fieldSelector") if query.get(k)}
            store.record("list" if name is None else "get", resource, ns, name or "", actor="client", **selectors)
        if name is None:
            if method == "GET":
                api_version, kind = LIST_KINDS[resource]
                items = store.list(resource, ns, query.get("labelSelector"))
                items = [o for o in items if _fields_match(o, query.get("fieldSelector"))]
                return {"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": now()},
                        "items": items}
            if method == "POST":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "the request body must be a JSON object")
                if resource == "mpijobs" and body.get("apiVersion") != GROUP_VERSION:
                    raise ApiError(400, "BadRequest", f"apiVersion must be {GROUP_VERSION}")
                body.pop("status", None)
                if (resource == "mpijobs" and ns in self.queued_namespaces
                        and QUEUE_NAME in (body.get("metadata") or {}).get("labels", {})):
                    # Kueue's webhook: a job naming a queue is created suspended until Kueue admits it
                    body.setdefault("spec", {}).setdefault("runPolicy", {})["suspend"] = True
                created = store.create(resource, ns, body)
                store.history[-1]["body"] = copy.deepcopy(body)
                return created
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on a collection")
        if method == "GET":
            return store.get(resource, ns, name)
        if method == "PATCH":
            if not isinstance(body, dict):
                raise ApiError(415, "UnsupportedMediaType", "only merge patches are simulated")
            body.pop("status", None)  # status belongs to the controller
            return store.update(resource, ns, name, lambda o: o.update(merge_patch(o, body)),
                                verb="patch", actor="client", patch=body)
        if method == "DELETE":
            options = body if isinstance(body, dict) else {}
            policy = query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
            if resource == "mpijobs" and policy == "Foreground":
                store.record("delete", resource, ns, name, actor="client", propagationPolicy=policy)

                def mark(o: dict[str, Any]) -> None:
                    o["metadata"].setdefault("deletionTimestamp", now())
                    finalizers = o["metadata"].setdefault("finalizers", [])
                    if "foregroundDeletion" not in finalizers:
                        finalizers.append("foregroundDeletion")

                return store.update(resource, ns, name, mark)
            obj = store.get(resource, ns, name)
            store.record("delete", resource, ns, name, actor="client", propagationPolicy=policy)
            if resource == "pods":
                self.cluster.kill(ns, name, "deleted")
            store.remove(resource, ns, name, reason=f"deleted ({policy})")
            return obj
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported")

    def sim_control(self, method: str, path: str, body: Any, query: dict[str, str]) -> Any:
        if path == "/sim/history" and method == "GET":
            namespace = query.get("namespace")
            with self.store.lock:
                return [copy.deepcopy(h) for h in self.store.history
                        if namespace is None or h["namespace"] == namespace]
        if path == "/sim/queue" and method == "PUT":
            self.queued_namespaces.add(body["namespace"])
            return sorted(self.queued_namespaces)
        if path == "/sim/node" and method == "PUT":
            self.cluster.node["gpus"] = int(body.get("gpus", self.cluster.node["gpus"]))
            self.cluster.node["pull_seconds"] = float(body.get("pull_seconds", self.cluster.node["pull_seconds"]))
            return self.cluster.node
        raise ApiError(404, "NotFound", path)


def _fields_match(obj: dict[str, Any], selector: str | None) -> bool:
    """``status.phase!=Failed``-style field selectors (the ones KPO's helpers send)."""
    involved = obj.get("involvedObject") or {}
    fields = {"status.phase": (obj.get("status") or {}).get("phase"), "metadata.name": obj["metadata"]["name"],
              "involvedObject.kind": involved.get("kind"), "involvedObject.name": involved.get("name")}
    return matches({k: v for k, v in fields.items() if v is not None}, selector)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="simulated Kubernetes cluster (test double)")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--image-bin-dir", type=Path, required=True,
                        help="what every container image maps to: a bin dir with python, horovodrun")
    parser.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu on the one simulated node")
    parser.add_argument("--token", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--without-mpijob-crd", action="store_true",
                        help="serve no kubeflow.org MPIJobs, as a cluster without the MPI Operator")
    args = parser.parse_args(argv)

    store = Store()
    cluster = Cluster(store, args.state_dir, args.image_bin_dir, args.gpus)
    server = SimServer(("127.0.0.1", args.port), store, cluster, args.token,
                       mpijob_crd=not args.without_mpijob_crd)
    parent = os.getppid()

    def stop(*_: Any) -> None:
        cluster.shutdown()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=cluster.run, daemon=True).start()

    def watch_parent() -> None:  # never outlive the test session that started us
        while not cluster.stopping.wait(1):
            if os.getppid() != parent:
                stop()

    threading.Thread(target=watch_parent, daemon=True).start()
    print(f"k8s-sim listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever(poll_interval=0.2)
    cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
