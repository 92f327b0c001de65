"""The bottom layer every release stage stands on, stdlib only (tqdm optional): where the build
tree lives (`paths`), the KT version (`version`) and progress for long work (`progress`).

Nothing here imports another package of this repository; `nox -s lint` checks it (import-linter)."""
