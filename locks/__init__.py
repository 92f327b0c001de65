"""The hash-locked requirement sets in lockfiles/: reading them (`read`), where their wheels come
from on this machine (`indexes`, stdlib only) and pip for another CPython and platform (`targets`).
Writing them is a maintainer's action (maint/lock.py)."""
