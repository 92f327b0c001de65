"""kt-release audits: read -> analyze -> report over built wheels.

python -m audits dist/ --json dist/audit-report.json

Names are imported when first used (PEP 562), so `from audits.policy import load_policy` or
`audits.report.printable` do not pull in the ELF and disassembly readers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import audit_wheel, run
    from .errors import AuditError, PolicyError
    from .model import RULES, Finding, Rule
    from .policy import Policy, load_policy

_WHERE = {
    "audit_wheel": "core",
    "run": "core",
    "AuditError": "errors",
    "PolicyError": "errors",
    "RULES": "model",
    "Finding": "model",
    "Rule": "model",
    "Policy": "policy",
    "load_policy": "policy",
}
__all__ = ["RULES", "AuditError", "Finding", "Policy", "PolicyError", "Rule", "audit_wheel", "load_policy", "run"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'audits' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
