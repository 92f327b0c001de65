"""`nox -s verify_install`: the release installed as its users install it, and proven. Every
profile is listed once in `registry`; `__main__` runs them: the venv profiles (`sft`, `serve`, `lf`),
the other interpreters (`interpreters`) and normal resolution (`resolution`). `probes/` holds the
programs run inside the installed venvs, by path. Stages above read `registry` only."""
