"""kt-release audits: read -> analyze -> report over built wheels.

python -m audits dist/ --json dist/audit-report.json
"""

from .core import audit_wheel, run
from .errors import AuditError, PolicyError
from .model import RULES, Finding, Rule
from .policy import Policy, load_policy

__all__ = ["RULES", "AuditError", "Finding", "Policy", "PolicyError", "Rule", "audit_wheel", "load_policy", "run"]
