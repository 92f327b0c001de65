"""Run by path with a candidate interpreter (base/interpreters.py): what it is, as JSON on one line.

Any CPython 3 runs it (stdlib only, nothing newer than 3.0's syntax): the finder asks an interpreter about itself
instead of trusting its file name, so a `python3.12` that is really 3.11, a PyPy, a free-threaded
build or one without `venv` is named for what it is.
"""

import json
import platform
import sys
import sysconfig


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def main() -> None:
    print(
        json.dumps(
            {
                "implementation": sys.implementation.name,
                "version": platform.python_version(),
                "major_minor": "{}.{}".format(*sys.version_info[:2]),
                "executable": sys.executable,
                "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
                "venv": _importable("venv") and _importable("ensurepip"),
                "machine": platform.machine(),
            }
        )
    )


if __name__ == "__main__":
    main()
