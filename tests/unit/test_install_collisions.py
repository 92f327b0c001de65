"""Installed-path ownership in a profile's closure (verify/owners.py): two distributions
writing one path with different bytes fail the verification; identical bytes, and collisions the
audit policy names with a reason, are reported but pass."""

from __future__ import annotations

from verify.owners import accepted_collisions, path_collisions


def test_different_bytes_at_one_path_conflict() -> None:
    conflicts, shared = path_collisions({"a": {"pkg/x.py": "h1", "a/y.py": "h"}, "b": {"pkg/x.py": "h2"}})
    assert conflicts == ["pkg/x.py: a and b"]
    assert shared == []


def test_identical_bytes_are_shared_not_conflicting() -> None:
    conflicts, shared = path_collisions(
        {"nvidia-a": {"nvidia/__init__.py": "e3b0"}, "nvidia-b": {"nvidia/__init__.py": "e3b0"}}
    )
    assert conflicts == []
    assert shared == ["nvidia/__init__.py: nvidia-a and nvidia-b"]


def test_a_missing_hash_is_never_taken_as_identical() -> None:
    conflicts, _ = path_collisions({"a": {"x.py": ""}, "b": {"x.py": ""}})
    assert conflicts == ["x.py: a and b"]


def test_the_policy_accepts_exactly_its_pair() -> None:
    accepted = accepted_collisions()
    assert accepted["build_backend.py"] == frozenset({"flashinfer-python", "torch-c-dlpack-ext"})
    owners = {"flashinfer-python": {"build_backend.py": "h1"}, "torch_c_dlpack_ext": {"build_backend.py": "h2"}}
    assert path_collisions(owners, accepted) == ([], ["build_backend.py: flashinfer-python and torch_c_dlpack_ext"])
    owners["other"] = {"build_backend.py": "h3"}
    assert path_collisions(owners, accepted)[0] == ["build_backend.py: flashinfer-python and other"]
