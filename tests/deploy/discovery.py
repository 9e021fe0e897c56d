"""Vertex AI's official REST schema (`aiplatform.v1.json`, the discovery document that
google-api-python-client ships; and Cloud Logging's, `logging.v2.json`, for the job logs a
wait streams) as a request router and a validator, for the fakes. The two documents share no
schema name.

Discovery documents say each field's type and format, and which are output-only (`readOnly`);
they do not say which fields are required. `validate` therefore reports unknown fields, wrong
types, bad enum values, malformed durations and int64s, and output-only fields in a request.

The client libraries' REST transport sends enum values as numbers (`$alt=json;enum-encoding=int`,
which the service accepts); `enum_names` reads them back as names with the library's own enum
tables, so that the names are then checked against the published schema.
"""

from __future__ import annotations

import functools
import json
import os
import re

import googleapiclient
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import descriptor_pool

_DOCUMENTS = os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents")
DOCUMENT = os.path.join(_DOCUMENTS, "aiplatform.v1.json")
LOGGING_DOCUMENT = os.path.join(_DOCUMENTS, "logging.v2.json")
_INT = re.compile(r"^-?\d+$")
_DURATION = re.compile(r"^-?\d+(\.\d{1,9})?s$")
_DATETIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


@functools.lru_cache(maxsize=2)
def document(path: str = DOCUMENT) -> dict:
    with open(path) as f:
        return json.load(f)


def schema(name: str) -> dict:
    """A named schema, e.g. "GoogleCloudAiplatformV1CustomJobSpec" (or Logging's
    "ListLogEntriesRequest")."""
    schemas = document()["schemas"]
    return schemas[name] if name in schemas else document(LOGGING_DOCUMENT)["schemas"][name]


@functools.lru_cache(maxsize=1)
def _methods() -> list[tuple[str, re.Pattern, str, str | None]]:
    """(HTTP method, path regex, method id, request schema) for every API method."""
    found = []

    def walk(resources: dict):
        for resource in resources.values():
            for method in resource.get("methods", {}).values():
                pattern = re.escape(method["flatPath"])
                pattern = re.sub(r"\\\{[^}]+\\\}", "[^/:]+", pattern)
                found.append(
                    (
                        method["httpMethod"],
                        re.compile(f"^/{pattern}$"),
                        method["id"],
                        method.get("request", {}).get("$ref"),
                    )
                )
            walk(resource.get("resources", {}))

    walk(document()["resources"])
    walk(document(LOGGING_DOCUMENT)["resources"])
    return found


def route(http_method: str, path: str) -> tuple[str, str | None] | None:
    """(method id, request schema name) of a REST call, or None if the API has no such call."""
    for method, pattern, method_id, request in _methods():
        if method == http_method and pattern.match(path):
            return method_id, request
    return None


def validate(value, schema_ref: str, where: str = "body") -> list[str]:
    """Every problem of `value` against the named schema, as 'where: what' strings."""
    return _check(value, {"$ref": schema_ref}, where)


def validate_response(value, schema_ref: str) -> list[str]:
    """`validate` of a response, whose output-only fields are what it is for."""
    return [
        e
        for e in validate(value, schema_ref, "response")
        if not e.endswith("output-only field in a request")
    ]


def enum_names(value, schema_ref: str):
    """`value` (a request body of the named schema) with every enum number replaced by its
    name, as the service reads a body sent with `enum-encoding=int`. A number the client
    library does not know, or a body the library has no message for, stays as it is (and then
    fails validation)."""
    import google.cloud.aiplatform_v1  # noqa: F401  (registers the v1 messages)

    prefix = "GoogleCloudAiplatformV1"
    try:
        message = descriptor_pool.Default().FindMessageTypeByName(
            "google.cloud.aiplatform.v1." + schema_ref.removeprefix(prefix)
        )
    except KeyError:
        return value
    return _enum_names(value, message)


def _enum_names(value, message: pb_descriptor.Descriptor):
    if not isinstance(value, dict) or message.full_name.startswith("google.protobuf."):
        return value  # Struct, Value, Duration...: JSON of their own, no enum numbers
    out = {}
    for key, item in value.items():
        field = message.fields_by_camelcase_name.get(key)
        out[key] = item if field is None else _field_names(item, field)
    return out


def _field_names(value, field: pb_descriptor.FieldDescriptor):
    if isinstance(value, list):
        return [_field_names(item, field) for item in value]
    if field.message_type is not None:
        if field.message_type.GetOptions().map_entry and isinstance(value, dict):
            entry = field.message_type.fields_by_name["value"]
            return {k: _field_names(v, entry) for k, v in value.items()}
        return _enum_names(value, field.message_type)
    if field.enum_type is not None and isinstance(value, int) and not isinstance(value, bool):
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    return value


def _check(value, spec: dict, where: str) -> list[str]:
    if "$ref" in spec:
        spec = schema(spec["$ref"])
    kind = spec.get("type")
    if kind == "object":
        return _check_object(value, spec, where)
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {value!r}"]
        return [
            e for i, item in enumerate(value) for e in _check(item, spec["items"], f"{where}[{i}]")
        ]
    return _check_scalar(value, kind, spec, where)


def _check_object(value, spec: dict, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: expected an object, got {value!r}"]
    errors = []
    properties = spec.get("properties", {})
    extra = spec.get("additionalProperties")
    for key, item in value.items():
        if key in properties:
            if properties[key].get("readOnly"):
                errors.append(f"{where}.{key}: output-only field in a request")
            errors += _check(item, properties[key], f"{where}.{key}")
        elif isinstance(extra, dict):
            errors += _check(item, extra, f"{where}[{key!r}]")
        else:
            errors.append(f"{where}.{key}: unknown field (not in {spec.get('id', 'schema')})")
    return errors


def _check_scalar(value, kind, spec: dict, where: str) -> list[str]:
    fmt = spec.get("format")
    ok = {
        "any": lambda: True,
        "boolean": lambda: isinstance(value, bool),
        "number": lambda: isinstance(value, (int, float)) and not isinstance(value, bool),
        "integer": lambda: (
            (isinstance(value, int) and not isinstance(value, bool))
            or (isinstance(value, str) and bool(_INT.match(value)))
        ),
        "string": lambda: (
            isinstance(value, str)
            and _string_format_ok(value, fmt)
            or (
                fmt in ("int64", "uint64")
                and isinstance(value, int)
                and not isinstance(value, bool)
            )
        ),
    }.get(kind, lambda: False)()
    if not ok:
        return [f"{where}: expected {kind}{f' ({fmt})' if fmt else ''}, got {value!r}"]
    if "enum" in spec and value not in spec["enum"]:
        return [f"{where}: {value!r} is not one of {spec['enum']}"]
    return []


def _string_format_ok(value: str, fmt: str | None) -> bool:
    if fmt in ("int64", "uint64"):
        return bool(_INT.match(value))
    if fmt == "google-duration":
        return bool(_DURATION.match(value))
    if fmt == "google-datetime":
        return bool(_DATETIME.match(value))
    return True
