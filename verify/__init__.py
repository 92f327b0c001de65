"""`nox -s verify_install`: the release installed as its users install it, and proven. The venv
profiles (`install`: sft-cpu, serve; `lf`: the LlamaFactory profiles), normal resolution
(`resolution`) and the other interpreters (`interpreters`). `probes/` holds the programs run inside
the installed venvs, by path."""
