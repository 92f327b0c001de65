"""The SBOMs a wheel ships (PEP 770: .dist-info/sboms/*.cdx.json), read and checked against CycloneDX's
own JSON schema by the CycloneDX library's validator, before any analyzer looks at them."""

from __future__ import annotations

import json
from functools import cache, partial
from typing import Any

from ._memo import checked
from ._wheel import WheelFacts


def documents(w: WheelFacts) -> list[str]:
    """The CycloneDX JSON SBOM members of a wheel."""
    prefix = f"{w.dist_info}/sboms/"
    return [m.name for m in w.members if m.name.startswith(prefix) and m.name.endswith(".cdx.json")]


@cache
def _validator(spec: str) -> Any:
    from ._json import jsonschema_module

    jsonschema_module()  # before cyclonedx imports it: without the slow optional checker, IRIs still checked
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    return JsonStrictValidator(SchemaVersion.from_version(spec))


def schema_problems(w: WheelFacts) -> dict[str, str]:
    """member -> why it is not a valid CycloneDX document, for each SBOM of the wheel that is not."""
    out = {}
    for member in documents(w):
        text = w.text(member) or ""
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as exc:  # nested past what the parser takes: hostile, not JSON
            out[member] = f"not JSON ({type(exc).__name__}: {str(exc)[:200]})"
            continue
        if not isinstance(doc, dict) or doc.get("bomFormat") != "CycloneDX":
            out[member] = "not a CycloneDX document (bomFormat)"
            continue
        problem = checked(
            "cyclonedx-iri",
            [text.encode()],
            ("cyclonedx-python-lib", "jsonschema", "rfc3986-validator"),
            partial(_invalid, text, doc),
        )
        if problem:
            out[member] = problem
    return out


def _invalid(text: str, doc: dict[str, Any]) -> str:
    """Why the CycloneDX document is not valid against its specVersion's schema, or ""."""
    spec = str(doc.get("specVersion"))
    try:
        validator = _validator(spec)
    except ValueError:
        return f"specVersion {spec!r} is no CycloneDX version this audit knows"
    error = validator.validate_str(text)
    return f"not valid CycloneDX {spec}: {str(error).splitlines()[0][:300]}" if error is not None else ""


def components(w: WheelFacts, documents: list[str], problems: dict[str, str]) -> tuple[int, frozenset[str]]:
    """(how many components, every SHA-256 they list) over a wheel's valid SBOMs."""
    count, hashes = 0, set()
    for member in documents:
        if member in problems:
            continue
        doc = json.loads(w.text(member) or "{}")
        for c in doc.get("components", []) if isinstance(doc, dict) else []:
            if isinstance(c, dict):
                count += 1
                hashes |= {str(h.get("content")) for h in c.get("hashes", []) if isinstance(h, dict)}
    return count, frozenset(hashes)
