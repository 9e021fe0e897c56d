"""Vertex ML Metadata for the fake Vertex AI service (`fake_vertex.FakeVertex` mixes this in):
the MetadataService methods the SDK calls for Vertex AI Experiments.

Vertex AI Experiments is built on ML Metadata: an experiment is a Context of schema
`system.Experiment`, a run a Context of schema `system.ExperimentRun` (its id is
`<experiment>-<run>`) added to the experiment as a child context; a run's params, summary
metrics and state live in its context's `metadata` (`_params`, `_metrics`, `_state`).
Executions and artifacts are stored too (the SDK links them to runs through
`addContextArtifactsAndExecutions`), and `queryContextLineageSubgraph` answers with what a
context holds. The request bodies are validated by `FakeVertex.handle` against the discovery
document like every other method; ids follow the API's rule (4-128 of a-z, 0-9 and -).

Also here: `service_account_key`, credentials for a separate process (the trainer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

_ID = re.compile(r"^[a-z0-9][a-z0-9-]{3,127}$")
_OUTPUT_ONLY = ("name", "etag", "createTime", "updateTime", "parentContexts")


class MetadataHandlers:
    """The MetadataService methods (handler names follow the discovery method ids, as in
    `FakeVertex`). Mixed into FakeVertex: uses its `resources`, `_fail`, `_operation`."""

    resources: dict[str, dict]
    _ids: Iterator[int]

    def _fail(self, code: int, status: str, message: str) -> NoReturn:  # FakeVertex's
        raise NotImplementedError

    def _operation(self, resource_name: str, response_type: str, response: dict) -> dict:
        raise NotImplementedError

    def _operations_get(self, name: str, query: dict, body: dict | None) -> dict:
        raise NotImplementedError

    # Reading the store (for tests) -------------------------------------------------------

    def metadata_resources(self, collection: str, schema_title: str | None = None) -> list[dict]:
        """Stored contexts, executions or artifacts, optionally of one schema title."""
        return [
            r
            for n, r in self.resources.items()
            if "/metadataStores/" in n
            and n.rsplit("/", 2)[-2] == collection
            and (schema_title is None or r.get("schemaTitle") == schema_title)
        ]

    def context_children(self, name: str) -> list[str]:
        return list(self._get_resource_of(name).get("_children", []))

    # MetadataStores ----------------------------------------------------------------------

    def _metadataStores_get(self, name, query, body):
        return self._get(name)

    # Handlers of create and list get the collection (`.../metadataStores/default/contexts`).

    def _metadataStores_create(self, stores, query, body):
        store_id = query.get("metadataStoreId") or "default"
        store = self._put(f"{stores}/{store_id}", body or {})
        return self._operation(store["name"], "MetadataStore", self._public(store))

    def _metadataStores_operations_get(self, name, query, body):
        return self._operations_get(name, query, body)

    # Contexts, executions, artifacts: create, get, patch, list --------------------------

    def _create(self, collection: str, path: str, query: dict, body: dict) -> dict:
        self._get_resource_of(path.rsplit("/", 1)[0])  # the store must exist
        given = query.get(f"{collection[:-1]}Id")
        if given is not None and not _ID.match(given):
            self._fail(
                400, "INVALID_ARGUMENT", f"{collection[:-1]}Id {given!r} is not 4-128 of a-z0-9-"
            )
        resource_id = given or str(next(self._ids))
        name = f"{path}/{resource_id}"
        if name in self.resources:
            self._fail(409, "ALREADY_EXISTS", f"{name} already exists")
        if collection == "executions":
            body = {"state": "NEW", **body}
        resource = self._put(name, {**body, "etag": "1"})
        return self._public(resource)

    def _get(self, name: str) -> dict:
        """A GET: a missing resource is an answer (the SDK asks before it creates), not a
        problem of the request."""
        if name not in self.resources:
            from tests.deploy.fake_vertex import ApiFailure

            raise ApiFailure(404, "NOT_FOUND", f"{name} not found")
        return self._public(self.resources[name])

    def _patch(self, name: str, query: dict, body: dict) -> dict:
        resource = self._get_resource_of(name)
        mask = [f for f in query.get("updateMask", "").split(",") if f]
        # Output-only fields in the body (the SDK sends its whole copy) are ignored.
        fields = mask or [k for k in body if k not in _OUTPUT_ONLY]
        for field in fields:
            key = _camel(field)
            if key in body:
                resource[key] = body[key]
            else:
                resource.pop(key, None)
        resource["etag"] = str(int(resource.get("etag", "1")) + 1)
        return self._public(resource)

    def _list(self, collection: str, path: str, query: dict) -> dict:
        found = [
            self._public(r)
            for n, r in self.resources.items()
            if n.startswith(f"{path}/")
            and "/" not in n[len(path) + 1 :]
            and _matches(r, query.get("filter", ""))
        ]
        return {collection: found}

    def _metadataStores_contexts_create(self, parent, query, body):
        return self._create("contexts", parent, query, body)

    def _metadataStores_contexts_get(self, name, query, body):
        return self._get(name)

    def _metadataStores_contexts_patch(self, name, query, body):
        return self._patch(name, query, body)

    def _metadataStores_contexts_list(self, parent, query, body):
        return self._list("contexts", parent, query)

    def _metadataStores_executions_create(self, parent, query, body):
        return self._create("executions", parent, query, body)

    def _metadataStores_executions_get(self, name, query, body):
        return self._get(name)

    def _metadataStores_executions_patch(self, name, query, body):
        return self._patch(name, query, body)

    def _metadataStores_executions_list(self, parent, query, body):
        return self._list("executions", parent, query)

    def _metadataStores_artifacts_create(self, parent, query, body):
        return self._create("artifacts", parent, query, body)

    def _metadataStores_artifacts_get(self, name, query, body):
        return self._get(name)

    def _metadataStores_artifacts_patch(self, name, query, body):
        return self._patch(name, query, body)

    def _metadataStores_artifacts_list(self, parent, query, body):
        return self._list("artifacts", parent, query)

    # Links -------------------------------------------------------------------------------

    def _metadataStores_contexts_addContextChildren(self, name, query, body):
        context = self._get_resource_of(name)
        for child in body.get("childContexts", []):
            self._get_resource_of(child)
            if child == name:
                self._fail(400, "INVALID_ARGUMENT", f"{name} cannot be its own child")
            children = context.setdefault("_children", [])
            if child not in children:
                children.append(child)
            parents = self.resources[child].setdefault("parentContexts", [])
            if name not in parents:
                parents.append(name)
        return {}

    def _metadataStores_contexts_addContextArtifactsAndExecutions(self, name, query, body):
        context = self._get_resource_of(name)
        for key in ("artifacts", "executions"):
            for member in body.get(key, []):
                self._get_resource_of(member)
                held = context.setdefault(f"_{key}", [])
                if member not in held:
                    held.append(member)
        return {}

    def _metadataStores_executions_addExecutionEvents(self, name, query, body):
        execution = self._get_resource_of(name)
        for event in body.get("events", []):
            self._get_resource_of(event["artifact"])
            execution.setdefault("_events", []).append({**event, "execution": name})
        return {}

    def _metadataStores_contexts_queryContextLineageSubgraph(self, name, query, body):
        context = self._get_resource_of(name)
        executions = list(context.get("_executions", []))
        artifacts = list(context.get("_artifacts", []))
        events = [e for x in executions for e in self.resources[x].get("_events", [])]
        artifacts += [e["artifact"] for e in events if e["artifact"] not in artifacts]
        return {
            "artifacts": [self._public(self.resources[a]) for a in artifacts],
            "executions": [self._public(self.resources[x]) for x in executions],
            "events": events,
        }

    # Helpers -----------------------------------------------------------------------------

    def _put(self, name: str, resource: dict) -> dict:
        from tests.deploy.fake_vertex import NOW

        resource = {**resource, "name": name, "createTime": NOW, "updateTime": NOW}
        self.resources[name] = resource
        return resource

    def _get_resource_of(self, name: str) -> dict:
        if name not in self.resources:
            self._fail(404, "NOT_FOUND", f"{name} not found")
        return self.resources[name]

    @staticmethod
    def _public(resource: dict) -> dict:
        """The resource as the API answers it (the fake's own links left out)."""
        return {k: v for k, v in resource.items() if not k.startswith("_")}


def _camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(p.title() for p in rest)


def _matches(resource: dict, filter_: str) -> bool:
    """The subset of the List filter syntax (AIP-160) the SDK sends: clauses joined by AND,
    each `field="value"` (schema_title, display_name) or `parent_contexts:"NAME"`."""
    for clause in (c.strip() for c in re.split(r"\s+AND\s+", filter_) if c.strip()):
        equal = re.fullmatch(r'(\w+)\s*=\s*"([^"]*)"', clause)
        has = re.fullmatch(r'(\w+)\s*:\s*"([^"]*)"', clause)
        if equal:
            if resource.get(_camel(equal.group(1))) != equal.group(2):
                return False
        elif has:
            if has.group(2) not in resource.get(_camel(has.group(1)), []):
                return False
        else:
            raise ValueError(f"the fake does not understand the filter clause {clause!r}")
    return True


def service_account_key(path: Path) -> Path:
    """Writes a service account key file (a fresh RSA key) for GOOGLE_APPLICATION_CREDENTIALS:
    a trainer process then authenticates through google-auth's ordinary Application Default
    Credentials, as on Vertex AI, with no network: the SDK's clients sign their own JWT bearer
    tokens with the key (self-signed JWT), so no token endpoint is called. (google-auth's
    background Regional Access Boundary lookup at iamcredentials.googleapis.com fails here and
    is retried later; it does not hold up requests.)"""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "my-project",
                "private_key_id": "fake-key",
                "private_key": pem,
                "client_email": "trainer@my-project.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": "http://127.0.0.1:9/token",  # never called (self-signed JWT)
            }
        )
    )
    return path
