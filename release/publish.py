"""Publish dist/ to a package index, hash-verified (`nox -s publish -- --repository-url URL`).

- What: the wheels SHA256SUMS lists, each re-hashed, and nothing else (a file dropped into dist/ by hand
  stays there, said so); the release verdict in manifest.json must have judged exactly these files and
  allow publishing (PASSED, or INCOMPLETE with every missing item accepted); a partial release never goes up.
- Before the first upload: the plan (release/plan.py) against the index's own state and rules; anything
  the index would refuse refuses the whole publish, with nothing uploaded. `--plan` prints it and stops.
- Order: computed from the carriers' own requirements (dependencies first), not a list.
- A file already there with identical bytes is skipped (a re-run after an interruption uploads the
  rest, and says which were there); different bytes under the same name are refused by the plan
  (never `--skip-existing`, which passes an older file off as success).
- After each upload: wait until the index serves the file, download it, compare sha256.
- After the last: the release is resolved from where it went (verify.resolution --index), unless --no-verify.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from base import distdir
from base.cli import dist_option
from base.errors import StageError, report
from carriers import wheelio
from carriers.graph import Graph
from locks.simple import ProjectState, project_state

from .errors import ReleaseError
from .plan import RULES_FILE, Plan, load_rules, make_plan, render


class PublishError(ReleaseError):
    """Publishing stopped; the message names the file and why."""


def upload_order(dist: Path, files: list[str]) -> list[str]:
    """Wheel filenames, each after every carrier it requires (any extra; carriers.graph orders them,
    cycles as one group). A distribution with one wheel per Python (kt-kernel: cp311, cp312) uploads
    all of them at its place."""
    by_name: dict[str, list[str]] = {}
    for f in sorted(files):
        by_name.setdefault(str(parse_wheel_filename(f)[0]), []).append(f)
    graph = Graph({name: wheelio.read_metadata(dist / fnames[0])[1] for name, fnames in by_name.items()})
    return [f for n in graph.upload_order() for f in by_name[n]]


def remote_sha256(url: str) -> str:
    """The sha256 of the bytes the index serves at `url` (downloaded)."""
    with urllib.request.urlopen(url, timeout=120) as resp:  # noqa: S310
        return hashlib.file_digest(resp, "sha256").hexdigest()


def releasable(dist: Path) -> distdir.Release:
    """dist/ opened (every listed file re-hashed), if its release verdict (release/report.py, in
    manifest.json's `release`) judged exactly these files and allows publishing (PASSED, or INCOMPLETE
    with every missing item accepted); PublishError naming the verdict and what it lacks otherwise. A
    partial release is never published."""
    try:
        release = distdir.open_release(dist)
    except distdir.DistError as exc:
        raise PublishError(str(exc)) from None
    manifest = release.manifest
    if manifest.partial:
        missing = ", ".join(manifest.partial.missing)
        raise PublishError(f"{dist} is a partial development release (no wheels for CPython {missing}); not published")
    judged = manifest.release
    if judged is None:
        raise PublishError(f"{dist} has no release verdict: run nox -s release (or release_report) before publishing")
    if judged.dist_sha256 != release.key():
        raise PublishError(
            f"the release verdict in {dist / distdir.MANIFEST} ({judged.verdict}, {judged.judged}) judged other "
            f"files than {dist} holds now; run nox -s release again"
        )
    if not judged.publishable:
        lacks = [f"{i.item} ({i.detail})" for i in judged.failed + judged.missing]
        raise PublishError(
            f"the release is {judged.verdict}, not published: "
            + "; ".join(lacks[:10])
            + (f"; and {len(lacks) - 10} more" if len(lacks) > 10 else "")
            + ". Fix what failed; run what is missing, or accept it by name with a reason "
            "(nox -s release -- --accept 'ITEM=REASON', or the policy's [[accept_incomplete]])"
        )
    return release


def release_files(release: distdir.Release) -> tuple[dict[str, tuple[str, int]], list[str]]:
    """({wheel: (sha256, size)} of every wheel the release lists (SHA256SUMS and manifest.json agree, each
    re-hashed when it was opened); the .whl files in dist/ it does not list, which are never uploaded)."""
    files = {w.filename: (w.sha256, w.size) for w in release.manifest.wheels}
    unlisted = sorted(p.name for p in release.path.glob("*.whl") if p.name not in files)
    return files, unlisted


def plan_for(
    dist: Path, index_url: str, *, add_to_existing: bool = False, rules_file: Path = RULES_FILE
) -> tuple[Plan, dict[str, tuple[str, int]]]:
    """The release's plan against `index_url` (the verdict checked first), and its files; the plan notes
    the wheels in dist/ it leaves out."""
    files, unlisted = release_files(releasable(dist))
    rules = load_rules(index_url, rules_file)
    projects = sorted({canonicalize_name(str(parse_wheel_filename(f)[0])) for f in files})
    states: dict[str, ProjectState] = {}
    for i, project in enumerate(projects, 1):
        print(f"[plan] {i}/{len(projects)}: {project} on {index_url} ...", flush=True)
        states[project] = project_state(index_url, project)
    plan = make_plan(files, index_url, rules, states, add_to_existing=add_to_existing)
    plan.notes += [f"{n} is in {dist} but not in SHA256SUMS: not uploaded" for n in unlisted]
    return plan, files


def publish(
    dist: Path,
    repository_url: str,
    index_url: str,
    wait_s: float = 120.0,
    twine_args: tuple[str, ...] = (),
    *,
    add_to_existing: bool = False,
    plan_only: bool = False,
    rules_file: Path = RULES_FILE,
) -> list[tuple[str, str]]:
    """Check the plan, then upload the release's wheels in dependency order, verifying each served file by
    sha256: (file, what happened) for each. Nothing is uploaded when the plan is refused (PublishError)."""
    plan, files = plan_for(dist, index_url, add_to_existing=add_to_existing, rules_file=rules_file)
    print(render(plan), flush=True)
    if not plan.ok:
        raise PublishError(
            f"the publish plan for {index_url} is refused; nothing was uploaded:\n  " + "\n  ".join(plan.problems)
        )
    if plan_only:
        return [(r.filename, f"plan: {r.state}") for r in plan.rows]
    sums = {n: d for n, (d, _) in files.items()}
    done: list[tuple[str, str]] = []
    order = upload_order(dist, list(sums))
    for i, fname in enumerate(order, 1):
        project = str(parse_wheel_filename(fname)[0])
        listed = project_state(index_url, project, sizes=False).files
        if fname in listed:  # there already (a re-run after an interruption): the same bytes, or refused
            served = listed[fname].sha256 or remote_sha256(listed[fname].url)
            if served != sums[fname]:
                raise PublishError(
                    f"{fname} appeared on {index_url} with different content (sha256 {served}, ours "
                    f"{sums[fname]}) after the plan was made. An index never replaces a file: publish a new version."
                )
            done.append((fname, "already there, identical (not uploaded again)"))
            print(f"[publish] {i}/{len(order)} {fname}: already there, identical", flush=True)
            continue
        print(f"[publish] {i}/{len(order)} {fname}: uploading {files[fname][1] / 2**20:.1f} MiB ...", flush=True)
        _upload(dist / fname, repository_url, twine_args)
        deadline = time.monotonic() + wait_s
        while True:
            listed = project_state(index_url, project, sizes=False).files
            if fname in listed:
                break
            if time.monotonic() > deadline:
                raise PublishError(f"{fname} was uploaded but {index_url} does not serve it after {wait_s:.0f}s")
            time.sleep(1.0)
        served = remote_sha256(listed[fname].url)  # the bytes themselves, not only what the page states
        if served != sums[fname] or listed[fname].sha256 not in (None, served):
            raise PublishError(f"{index_url} serves {fname} with sha256 {served}, not the uploaded {sums[fname]}")
        done.append((fname, "uploaded, verified"))
    return done


def _upload(path: Path, repository_url: str, twine_args: tuple[str, ...]) -> None:
    """One file up with twine (PEP 740 attestations first where asked)."""
    if "--attestations" in twine_args:
        # PEP 740: sign with the CI's ambient OIDC identity (trusted publishing); twine uploads the result.
        sign = subprocess.run(
            [sys.executable, "-m", "pypi_attestations", "sign", str(path)], capture_output=True, text=True, check=False
        )
        if sign.returncode != 0:
            raise PublishError(
                f"attesting {path.name} failed (is this CI with id-token: write?):\n{sign.stderr[-2000:]}"
            )
    cmd = [sys.executable, "-m", "twine", "upload", "--non-interactive", "--disable-progress-bar"]
    proc = subprocess.run(
        [*cmd, "--repository-url", repository_url, *twine_args, str(path)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise PublishError(f"twine upload {path.name} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def verify_published(dist: Path, index_url: str) -> int:
    """Normal resolution of every install profile from `index_url` (verify.resolution --index): the exit status."""
    print(f"[publish] resolving the release from {index_url} (verify.resolution --index) ...", flush=True)
    return subprocess.run(
        [sys.executable, "-m", "verify.resolution", "--dist", str(dist), "--index", index_url], check=False
    ).returncode


def main(argv: list[str] | None = None) -> int:
    """The publish CLI."""
    p = argparse.ArgumentParser(prog="nox -s publish --")
    p.add_argument("--repository-url", required=True, help="upload endpoint (twine --repository-url)")
    p.add_argument("--index-url", help="its simple index, PEP 691 or 503 (default: <repository-url>/simple/)")
    dist_option(p, "the release to publish")
    p.add_argument("--wait", type=float, default=120.0, help="seconds to wait for an upload to be served")
    p.add_argument("--attestations", action="store_true", help="upload PEP 740 attestations (twine --attestations)")
    p.add_argument("--plan", action="store_true", help="print the plan against the index and upload nothing")
    p.add_argument(
        "--add-to-existing",
        action="store_true",
        help="add files to a version the index already holds (only inside the index's window for that release)",
    )
    p.add_argument("--rules", type=Path, default=RULES_FILE, help="what each index accepts (default: %(default)s)")
    p.add_argument("--no-verify", action="store_true", help="skip resolving the release from the index afterwards")
    args = p.parse_args(argv)
    index = args.index_url or args.repository_url.rstrip("/") + "/simple/"
    extra: tuple[str, ...] = ("--attestations",) if args.attestations else ()
    if "TWINE_USERNAME" not in os.environ and "TWINE_PASSWORD" not in os.environ and "127.0.0.1" in args.repository_url:
        extra += ("-u", "kt", "-p", "kt")  # a local test index takes any credentials
    try:
        done = publish(
            args.dist,
            args.repository_url,
            index,
            args.wait,
            extra,
            add_to_existing=args.add_to_existing,
            plan_only=args.plan,
            rules_file=args.rules,
        )
    except StageError as exc:  # PublishError, PlanError, and the carriers' root (unreadable wheel metadata)
        return report(exc)
    if args.plan:
        return 0
    for fname, what in done:
        print(f"{fname}: {what}")
    return 0 if args.no_verify else verify_published(args.dist, index)


if __name__ == "__main__":
    raise SystemExit(main())
