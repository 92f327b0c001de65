"""A verification profile's result, reused when nothing it depends on changed (base/stages.py derives
what: the wheels dist/ lists and its manifest, the code the profile's entry imports with its data files,
the locks, the allowlisted environment, the Python, this host's CPU); a result obtained from a live
index also expires (`max_age_s`).

Every result carries the key of the exact dist/ it was obtained on (`dist_sha256`), whether this run
produced it or reused it, and when it was produced: the release report shows a result obtained on other
wheels as "not verified for this build". Only a result that proved everything is recorded; one that
failed or could not verify (NOT VERIFIED) always runs again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from base import distdir, stagecache, stages

from .venv import VerifyError

T = TypeVar("T")


def dist_key(dist: Path) -> str:
    """dist_sha256 of dist/ (every listed file re-hashed), or VerifyError saying what is wrong."""
    try:
        return distdir.key(dist)
    except distdir.DistError as exc:
        raise VerifyError(str(exc)) from None


def run(
    profile: str,
    dist: Path,
    key: str,
    work: Callable[[], T],
    *,
    proved: Callable[[T], bool] = lambda _: True,
    extra: Mapping[str, object] | None = None,
    fresh: bool = False,
    dist_free: bool = False,
) -> tuple[T, dict[str, Any]]:
    """(the result, its stamp: dist_sha256, installs_from_dist, outcome "ran" or "reused", produced).
    `dist_free`: the profile installs nothing of dist/, so its result holds for any build."""
    found = Lookup(profile, dist, key, extra=extra, fresh=fresh, dist_free=dist_free)
    if found.hit is not None:
        return found.hit
    result = work()
    return result, found.record(result, proved(result))


class Lookup:
    """One profile's record looked up (`hit`: the reused result and its stamp, or None); `record()`
    after running it. For callers that run their misses together (normal resolution: one index)."""

    def __init__(
        self,
        profile: str,
        dist: Path,
        key: str,
        *,
        extra: Mapping[str, object] | None = None,
        fresh: bool = False,
        dist_free: bool = False,
        max_age_s: float | None = None,
    ) -> None:
        self.stage = stages.verify(
            profile, dist, stages.DIST_FREE if dist_free else key, extra=extra, fresh=fresh, max_age_s=max_age_s
        )
        self.stamp: dict[str, Any] = {"dist_sha256": key, "installs_from_dist": not dist_free}
        found = self.stage.reuse()
        self.hit: tuple[Any, dict[str, Any]] | None = None
        if found is not None:
            self.hit = (found.result, {**self.stamp, "outcome": "reused", "produced": found.produced})

    def record(self, result: Any, proved: bool) -> dict[str, Any]:
        """Record a result that proved everything; its stamp either way."""
        if proved:
            self.stage.done(result)
        else:
            self.stage.release()
        return {**self.stamp, "outcome": "ran", "produced": stagecache.Stage.now()}
