"""Request bodies declared once, as JSON Schema.

A route that reads a JSON object off the cold path (a batch job, a webhook endpoint)
declares its body as one schema: the OpenAPI document shows it, and ``BodySchema.check``
holds a body to it, answering the first misfit as a 400 that names the field and what it
must be (``param`` set to the field). What a schema cannot say (a window's spelling, a
file that must exist) the route checks after. The hot routes (``POST /v1/tasks``,
``/v1/embeddings``) parse by hand, from the same constants (bench/results/body_checks.md
times both).
"""

from __future__ import annotations

from typing import Any, cast

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from brimful.api.http.bodies import ApiError


class BodySchema:
    """One request body's schema and the check that holds a body to it."""

    def __init__(self, schema: dict[str, Any]) -> None:
        Draft202012Validator.check_schema(schema)
        self.schema = schema
        self._validator = Draft202012Validator(schema)

    def check(self, document: Any) -> dict[str, Any]:
        """``document``, if it fits; else a 400 naming the first field that does not."""
        error = best_match(self._validator.iter_errors(document))
        if error is None:
            checked: dict[str, Any] = document
            return checked
        field = _field(error)
        raise ApiError(400, "invalid_request", misfit(error), param=field or None)


def _field(error: ValidationError) -> str:
    """The dotted path of the value at fault ("" for the body itself)."""
    parts = [str(part) for part in error.absolute_path]
    if error.validator == "required":
        parts.append(_missing(error))
    return ".".join(parts)


def _missing(error: ValidationError) -> str:
    present = error.instance if isinstance(error.instance, dict) else {}
    required: list[str] = list(error.validator_value) if isinstance(error.validator_value, list) else []
    return next((name for name in required if name not in present), "")


def _properties(error: ValidationError) -> dict[str, Any]:
    """The properties the schema at fault declares."""
    schema = error.schema if isinstance(error.schema, dict) else {}
    properties: dict[str, Any] = schema.get("properties", {})
    return properties


def misfit(error: ValidationError) -> str:
    """What is wrong, in words a client can act on."""
    field = _field(error) or "body"
    rule, value = error.validator, error.validator_value
    if rule == "additionalProperties" and isinstance(error.instance, dict):
        allowed = list(_properties(error))
        unknown = sorted(set(error.instance) - set(allowed))
        return f"unknown field(s) in {field}: {', '.join(unknown)}; allowed: {', '.join(allowed)}"
    if rule == "required":
        described = _properties(error).get(_missing(error), {}).get("description")
        return f"{field} is required" + (f": {described}" if described else "")
    if rule == "type":
        return f"{field} must be {_kind(value)}"
    if rule == "enum":
        return f"{field} must be one of: {', '.join(str(choice) for choice in cast(list[Any], value))}"
    template = _BOUNDS.get(str(rule))
    return f"{field}: {template.format(value)}" if template else f"{field}: {error.message}"


_KINDS = {"object": "an object", "array": "a list", "string": "a string", "integer": "a whole number"}
_BOUNDS = {
    "minimum": "must be at least {}",
    "maximum": "must be at most {}",
    "minLength": "must be at least {} characters",
    "maxLength": "must be at most {} characters",
    "minItems": "must hold at least {} items",
    "maxItems": "must hold at most {} items",
    "maxProperties": "must hold at most {} pairs",
    "pattern": "must match {}",
}


def _kind(value: Any) -> str:
    kinds = value if isinstance(value, list) else [value]
    return " or ".join(_KINDS.get(kind, f"a {kind}") for kind in kinds)
