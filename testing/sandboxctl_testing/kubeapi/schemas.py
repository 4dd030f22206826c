"""CustomResourceDefinitions: the resource types one registers, and its structural schema
applied to every write (unknown fields pruned or refused, then the rest validated).

Validation runs the schema, compiled once per CRD version by ``fastjsonschema`` (a
2000-entry NodeInventory validates in milliseconds), after translating the OpenAPI v3 parts
JSON Schema lacks (``nullable``; the ``x-kubernetes-*`` extensions are ignored except
``x-kubernetes-preserve-unknown-fields``, which stops pruning below it, and
``x-kubernetes-int-or-string``). ``format: date-time`` is checked as RFC 3339.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import fastjsonschema

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.timestamps import parse_rfc3339
from sandboxctl_testing.kubeapi.patches import clone
from sandboxctl_testing.kubeapi.resources import Column, ResourceType

ROOT_FIELDS = frozenset({"apiVersion", "kind", "metadata"})
Validator = Callable[[Any], Any]
_compiled: dict[int, tuple[Mapping[str, Any], Validator]] = {}


def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        parse_rfc3339(value)
    except InvalidValueError:
        return False
    return True


def _validator(schema: Mapping[str, Any]) -> Validator:
    """The compiled validator of one CRD version's schema (compiled on first use)."""
    cached = _compiled.get(id(schema))
    if cached is None or cached[0] is not schema:
        compiled = fastjsonschema.compile(
            _json_schema(_without_metadata(schema)), formats={"date-time": _is_date_time}
        )
        cached = (schema, compiled)
        _compiled[id(schema)] = cached
    return cached[1]


class SchemaError(Exception):
    """A CRD that cannot be served, or an object its schema refuses; ``field`` names where."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


def crd_resources(crd: Mapping[str, Any]) -> list[ResourceType]:
    """The served versions of a CRD as resource types (SchemaError on a bad spec)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    if not group or not plural or not kind:
        raise SchemaError("spec", "group, names.plural and names.kind are required")
    expected = f"{plural}.{group}"
    if (crd.get("metadata") or {}).get("name") != expected:
        raise SchemaError("metadata.name", f"must be spec.names.plural+'.'+spec.group: {expected}")
    scope = spec.get("scope")
    if scope not in ("Namespaced", "Cluster"):
        raise SchemaError("spec.scope", "must be Namespaced or Cluster")
    out = [
        ResourceType(
            group,
            version["name"],
            plural,
            kind,
            scope == "Namespaced",
            singular=names.get("singular") or kind.lower(),
            short_names=tuple(names.get("shortNames") or ()),
            status="status" in (version.get("subresources") or {}),
            columns=_columns(version),
            schema=_version_schema(version, index),
        )
        for index, version in enumerate(spec.get("versions") or [])
        if version.get("served", True)
    ]
    if not out:
        raise SchemaError("spec.versions", "at least one version must be served")
    return out


def _version_schema(version: Mapping[str, Any], index: int) -> dict[str, Any]:
    """A served version's structural schema, refused when it does not compile."""
    schema = (version.get("schema") or {}).get("openAPIV3Schema")
    if not isinstance(schema, dict):
        raise SchemaError(f"spec.versions[{index}].schema.openAPIV3Schema", "required")
    try:
        _validator(schema)
    except fastjsonschema.JsonSchemaDefinitionException as error:
        raise SchemaError(f"spec.versions[{index}].schema", str(error)) from None
    return schema


def _columns(version: Mapping[str, Any]) -> tuple[Column, ...]:
    return tuple(
        Column(
            c["name"],
            c.get("type", "string"),
            c["jsonPath"],
            c.get("description", ""),
            c.get("format", ""),
            c.get("priority", 0),
        )
        for c in version.get("additionalPrinterColumns") or []
    )


def established(crd: dict[str, Any], now: str) -> dict[str, Any]:
    """The status a registered CRD carries."""
    names = (crd.get("spec") or {}).get("names") or {}
    conditions = [
        {"type": kind, "status": "True", "reason": reason, "lastTransitionTime": now, "message": ""}
        for kind, reason in (
            ("NamesAccepted", "NoConflicts"),
            ("Established", "InitialNamesAccepted"),
        )
    ]
    return {
        "acceptedNames": dict(names),
        "conditions": conditions,
        "storedVersions": [
            v["name"] for v in (crd.get("spec") or {}).get("versions") or [] if v.get("storage")
        ],
    }


def admit(resource: ResourceType, obj: dict[str, Any], strict: bool) -> list[str]:
    """Apply the schema to ``obj`` in place: prune unknown fields (or, ``strict``, refuse
    them), then validate. Returns the pruned paths (for a Warning header)."""
    schema = resource.schema
    if schema is None:
        return []
    pruned: list[str] = []
    _prune(obj, schema, "", pruned, root=True)
    if pruned and strict:
        raise SchemaError(pruned[0], "field not declared in schema (strict decoding error)")
    body = {k: v for k, v in obj.items() if k != "metadata"}
    try:
        _validator(schema)(body)
    except fastjsonschema.JsonSchemaValueException as error:
        where = str(error.name).removeprefix("data").lstrip(".")
        problem = str(error.message).removeprefix(str(error.name)).strip()
        raise SchemaError(where, problem) from None
    return pruned


def _without_metadata(schema: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(schema)
    properties = dict(out.get("properties") or {})
    properties.pop("metadata", None)
    out["properties"] = properties
    out["required"] = [r for r in out.get("required") or [] if r != "metadata"]
    if not out["required"]:
        del out["required"]
    return out


def _prune(
    value: Any, schema: Mapping[str, Any], path: str, pruned: list[str], root: bool = False
) -> None:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        if properties is not None:
            for key in list(value):
                if root and key in ROOT_FIELDS:
                    continue
                if key in properties:
                    _prune(value[key], properties[key], f"{path}.{key}" if path else key, pruned)
                elif isinstance(additional, dict):
                    _prune(value[key], additional, f"{path}.{key}" if path else key, pruned)
                else:
                    pruned.append(f"{path}.{key}" if path else key)
                    del value[key]
        elif isinstance(additional, dict):
            for key, item in value.items():
                _prune(item, additional, f"{path}.{key}" if path else key, pruned)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            _prune(item, schema["items"], f"{path}[{index}]", pruned)


def _json_schema(schema: Any) -> Any:
    """OpenAPI v3 (as CRDs write it) to JSON Schema draft 7."""
    if isinstance(schema, list):
        return [_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "example", "externalDocs"):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: _json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf"):
            out[key] = _json_schema(value)
        else:
            out[key] = clone(value)
    if schema.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if schema.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out
