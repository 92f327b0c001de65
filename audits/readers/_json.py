"""JSON the audit reads from a wheel or the command line, validated against its schema
(audits/schemas/) before any analyzer looks at it: a document of the wrong shape is a finding
(or, for an argument, an error) that names the file, the JSON path and what was expected."""

from __future__ import annotations

import importlib.resources
import json
from functools import cache
from typing import Any

PAYLOAD_MANIFEST = "payload-manifest"
BUILD_MANIFEST = "build-manifest"
KT_UPSTREAM = "kt-upstream"
SIZE_BASELINE = "size-baseline"


@cache
def _validator(schema: str) -> Any:
    import jsonschema

    text = (importlib.resources.files("audits") / "schemas" / f"{schema}.schema.json").read_text()
    return jsonschema.Draft202012Validator(json.loads(text))


def _where(path: Any) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def shape_error(doc: Any, schema: str) -> str:
    """Empty if `doc` has the schema's shape, else the first problem: where and what."""
    errors = sorted(_validator(schema).iter_errors(doc), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if not errors:
        return ""
    first = errors[0]
    message = first.message if len(first.message) <= 200 else first.message[:200] + "..."
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"at {_where(first.absolute_path)}: {message}{more}"


def load(data: bytes | str, schema: str) -> tuple[Any, str]:
    """(document, "") when `data` is JSON of the schema's shape, else (None, what is wrong)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return None, f"not JSON: {exc}"
    problem = shape_error(doc, schema)
    return (None, f"not a {schema} document {problem}") if problem else (doc, "")
