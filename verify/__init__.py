"""Install verification stages (nox -s verify_install). Today: the normal-resolution check
(verify.resolution); the venv profiles still live in tools/verify_install.py."""
