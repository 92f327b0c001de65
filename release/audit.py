"""The release's audit stage: `python -m release.audit --dist dist [--baseline F] [--summary F] [--fresh]`.

The audit of exactly these wheels (every file dist/SHA256SUMS lists, re-hashed), with this policy,
this audit code and lock, is reused from its record (base/stages.py says what the key holds); anything
else runs `python -m audits` over dist/ into dist/audit-report.{json,md}. Only a passing audit is
recorded, so a failing one always runs again. Third-party wheels (`nox -s audit -- PATH...`) are
audited directly, never through this cache.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from audits import report
from audits.__main__ import main as audit_main
from base import stagecache, stages
from base.paths import DIST


def main(argv: list[str] | None = None) -> int:
    """0 the audit passed (ran or reused), else the audit's own exit status."""
    p = argparse.ArgumentParser(prog="python -m release.audit")
    p.add_argument("--dist", type=Path, default=DIST)
    p.add_argument("--baseline", type=Path, help="a previous audit-report.json, for size growth")
    p.add_argument("--summary", type=Path, help="append the Markdown summary here (CI: $GITHUB_STEP_SUMMARY)")
    p.add_argument("--fresh", action="store_true", help="audit even if these wheels passed this audit before")
    args = p.parse_args(argv)
    reports = [args.dist / "audit-report.json", args.dist / "audit-report.md"]
    try:
        stage = stages.audit(args.dist, reports, args.baseline, fresh=args.fresh or args.summary is not None)
    except stagecache.DistError as exc:
        print(f"error: {exc}")
        return 2
    if stage.reuse() is not None:
        result = json.loads(reports[0].read_text())
        print(report.to_terminal(result), end="")
        return 0
    extra = [*(["--baseline", str(args.baseline)] if args.baseline else [])]
    extra += ["--summary", str(args.summary)] if args.summary else []
    status = audit_main([str(args.dist), "--json", str(reports[0]), "--markdown", str(reports[1]), *extra])
    if status == 0:
        stage.done()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
