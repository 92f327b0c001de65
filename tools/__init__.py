"""Release tooling that belongs to no single part (locks, benchmarks)."""
