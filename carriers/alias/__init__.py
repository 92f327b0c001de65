"""What the dist_alias fork ships beside upstream's files (see _kt_dist_alias.py)."""
