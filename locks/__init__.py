"""The hash-locked requirement sets in lockfiles/: reading them (`read`) and where their wheels come
from on this machine (`indexes`, stdlib only). Writing them is a maintainer's action (maint/lock.py)."""
