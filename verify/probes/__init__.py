"""Programs run by path inside an installed venv (its own Python, none of this repository on its
path): each prints one JSON line. Only what they import from the venv is available to them."""
