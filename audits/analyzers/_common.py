from __future__ import annotations

from ..model import RULES, Finding, Severity


def finding(rule: str, wheel: str, member: str, message: str, fix: str, severity: Severity = "error") -> Finding:
    """A Finding of a catalogued rule (an unknown id is a programming error)."""
    assert rule in RULES, f"unknown rule id {rule}"
    return Finding(rule, severity, wheel, member, message, fix)
