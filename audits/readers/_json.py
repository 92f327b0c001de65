"""JSON the audit reads from a wheel or the command line, validated against its schema
(audits/schemas/) before any analyzer looks at it: a document of the wrong shape is a finding
(or, for an argument, an error) that names the file, the JSON path and what was expected."""

from __future__ import annotations

import difflib
import importlib.resources
import json
from collections.abc import Iterable
from functools import cache
from typing import Any

PAYLOAD_MANIFEST = "payload-manifest"
BUILD_MANIFEST = "build-manifest"
KT_UPSTREAM = "kt-upstream"
SIZE_BASELINE = "size-baseline"
RELEASE_MANIFEST = "release-manifest"  # dist/manifest.json; generated from base/distdir.py


@cache
def jsonschema_module() -> Any:
    """jsonschema, imported once for the audit without rfc3987_syntax (its grammar is built when jsonschema
    is imported: 1.0 s and 20 MiB, most of an audit's time on a small wheel), and with IRI formats still
    checked as RFC 3987 defines them: an IRI is valid when its mapping to a URI (§3.1: every character
    outside ASCII as its UTF-8 %XX octets) is a valid URI (rfc3986-validator, the library jsonschema checks
    URIs with)."""
    import sys

    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # an import of it fails
    import jsonschema
    from rfc3986_validator import validate_rfc3986  # type: ignore[import-untyped]

    def iri(rule: str) -> Any:
        def check(value: object) -> bool:
            if not isinstance(value, str):
                return True
            mapped = "".join(c if ord(c) < 128 else "".join(f"%{b:02X}" for b in c.encode()) for c in value)
            return bool(validate_rfc3986(mapped, rule=rule))

        return check

    for cls in (jsonschema.Draft7Validator, jsonschema.Draft202012Validator):
        checker = cls.FORMAT_CHECKER
        if "iri" not in checker.checkers:
            checker.checks("iri")(iri("URI"))
        if "iri-reference" not in checker.checkers:
            checker.checks("iri-reference")(iri("URI_reference"))
    return jsonschema


@cache
def _validator(schema: str) -> Any:
    jsonschema = jsonschema_module()
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


def unknown_keys(errors: Iterable[Any]) -> list[tuple[tuple[Any, ...], str, list[str]]]:
    """(where, key, the keys allowed there) for every key a schema's `additionalProperties: false`
    refuses, in path order: the schema is the one owner of a document's keys."""
    out = []
    for e in sorted(errors, key=lambda e: [str(x) for x in e.absolute_path]):
        if e.validator != "additionalProperties" or e.validator_value is not False or not isinstance(e.instance, dict):
            continue
        known = sorted(e.schema.get("properties", {}))
        out += [(tuple(e.absolute_path), key, known) for key in sorted(set(e.instance) - set(known))]
    return out


def hint(word: str, choices: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the closest of `choices`, else the list of them."""
    known = sorted(choices)
    close = difflib.get_close_matches(word, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(known)}"
