from __future__ import annotations

from ..model import RULES, Finding, Severity


def finding(rule: str, wheel: str, member: str, message: str, fix: str, severity: Severity = "error") -> Finding:
    assert rule in RULES, f"unknown rule id {rule}"
    return Finding(rule, severity, wheel, member, message, fix)
