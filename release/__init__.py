"""After the proof: the release's summary (`report`: dist/release-report.{md,html}, `nox -s
release_report`) and its upload in dependency order (`publish`, `nox -s publish`)."""
