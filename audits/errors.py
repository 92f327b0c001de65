"""The audits' one exception root; only the CLI catches it."""

from __future__ import annotations


class AuditError(Exception):
    """Bad input to the audit itself (unreadable wheel, bad policy): exit 2."""

    exit_code = 2


class PolicyError(AuditError):
    """A policy file is malformed; the message names the file, key and fix."""
