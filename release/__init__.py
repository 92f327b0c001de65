"""After the proof: the audit stage (`audit`, with the known vulnerabilities in `vulns`/`osv`), the
release's summary and verdict (`report`, `verdict`: dist/release-report.{md,html}, `nox -s
release_report`) and its upload (`publish`, its plan against the index in `plan`, `nox -s publish`)."""
