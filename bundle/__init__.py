"""nox -s bundle: an offline bundle of one install profile for one Python (see bundle.build)."""
