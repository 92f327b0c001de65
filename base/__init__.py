"""The bottom layer every release stage stands on, stdlib only (tqdm optional): where the build
tree lives (`paths`), the KT version and Python tags (`version`), `dist/` as one typed contract
(`distdir`), each stage's content key and sealed record (`keys`, `stages`, `stagecache`), the kill-safe
replacement of `dist/` (`swap`), the options every stage's command line shares (`cli`), the error root
(`errors`) and progress for long work (`progress`).

Nothing here imports another package of this repository; `nox -s lint` checks it (import-linter)."""
