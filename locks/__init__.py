"""The hash-locked requirement sets in lockfiles/: reading them (`read`), where their wheels come
from on this machine (`indexes`, stdlib only), pip for another CPython and platform (`targets`) and
an index's project pages (`simple`).
Writing them is a maintainer's action (maint/lock.py)."""
