"""Publish dist/ to a package index, hash-verified (`nox -s publish -- --repository-url URL`).

- What: a snapshot of the release (every file SHA256SUMS lists, manifest.json, the audit's evidence) copied
  out of dist/ and re-hashed against SHA256SUMS; the uploads come from the snapshot, so an assembly that
  replaces dist/ meanwhile can never get a wheel uploaded that no verdict judged. A file dropped into dist/
  by hand is never uploaded (said so); a partial release never goes up.
- Judged again: the verdict is computed anew from the evidence (the audit report, each Python's
  verification evidence) for exactly the snapshot's bytes, with the policy's acceptances in force today and
  publish's own --accept; a stored verdict in manifest.json that disagrees is refused, as is anything but
  PASSED or INCOMPLETE with every missing item accepted. A stored verdict is never trusted.
- Before the first upload: the plan (release/plan.py) against the index's own state and rules; anything
  the index would refuse refuses the whole publish, with nothing uploaded. `--plan` is a dry run that needs
  only the index: it prints the plan whatever the verdict, then what the verdict would refuse.
- Order: computed from the carriers' own requirements (dependencies first), not a list.
- A file already there with identical bytes is skipped (a re-run after an interruption uploads the
  rest, and says which were there); different bytes under the same name are refused by the plan
  (never `--skip-existing`, which passes an older file off as success).
- After each upload: wait until the index serves the file, download it, compare sha256.
- After the last: the release is resolved from where it went (verify.resolution --index), unless --no-verify.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from base import distdir, paths, swap
from base.cli import dist_option
from base.errors import StageError, report
from carriers import wheelio
from carriers.graph import Graph
from locks.simple import ProjectState, file_sha256, project_state

from . import judge as judging
from . import verdict as verdicts
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
    """The sha256 of the bytes the index serves at `url` (downloaded over http(s), bounded)."""
    return file_sha256(url)


@contextlib.contextmanager
def snapshot(dist: Path, work: Path | None = None) -> Iterator[distdir.Release]:
    """The release copied out of `dist` (its listed files, SHA256SUMS, manifest.json and the audit's evidence)
    into a folder of this process, opened there (every file re-hashed against SHA256SUMS), removed after."""
    if not (dist / distdir.MANIFEST).is_file():
        raise PublishError(
            f"{dist / distdir.MANIFEST} is missing: {dist} holds no release; build it (nox -s build_all)"
        )
    work = work or paths.PUBLISH_WORK
    work.mkdir(parents=True, exist_ok=True)
    snap = swap.part(work / "snapshot")
    shutil.rmtree(snap, ignore_errors=True)
    try:
        try:
            listed = [name for _, name in distdir.read_sums(dist / distdir.SUMS)]
            names = [distdir.SUMS, distdir.MANIFEST, *listed]
            evidence = (judging.AUDIT_REPORT, judging.VULNERABILITIES, judging.DIFF)
            names += [n for n in evidence if (dist / n).is_file()]
            for name in names:
                (snap / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(dist / name, snap / name)
            release = distdir.open_release(snap)
        except (OSError, distdir.DistError) as exc:
            raise PublishError(f"{dist}: {exc}".replace(str(snap), str(dist))) from None
        yield release
    finally:
        shutil.rmtree(snap, ignore_errors=True)


def rejudge(release: distdir.Release, accept: Iterable[str] = (), evidence: Path | None = None) -> verdicts.Verdict:
    """The verdict judged anew for exactly the snapshot's bytes (release.judge), with the policy's acceptances in
    force today and `accept`."""
    ev = judging.collect(release.path, release.key(), evidence, release.manifest)
    return judging.judge(ev, accept)


def releasable(release: distdir.Release, judged: verdicts.Verdict, where: Path) -> None:
    """PublishError unless the verdict judged now allows publishing and the stored one (manifest.json's
    `release`, written by nox -s release_report) says the same of the same bytes. A partial release is never
    published."""
    manifest = release.manifest
    if manifest.partial:
        missing = ", ".join(manifest.partial.missing)
        raise PublishError(f"{where} is a partial development release (no wheels for CPython {missing}); not published")
    if not judged.publishable:
        lacks = [f"{i.name} ({i.detail})" for i in judged.failed + judged.missing]
        raise PublishError(
            f"the release is {judged.verdict}, judged now for the bytes to upload; not published: "
            + "; ".join(lacks[:10])
            + (f"; and {len(lacks) - 10} more" if len(lacks) > 10 else "")
            + ". Fix what failed; run what is missing, or accept it by name with a reason "
            "(nox -s publish -- --accept 'ITEM=REASON', or the policy's [[accept_incomplete]])"
        )
    stored = manifest.release
    if stored is None:
        raise PublishError(f"{where} has no release verdict: run nox -s release (or release_report) before publishing")
    if stored.dist_sha256 != release.key():
        raise PublishError(
            f"the release verdict in {where / distdir.MANIFEST} ({stored.verdict}, {stored.judged}) judged other "
            f"files than {where} holds now; run nox -s release again"
        )
    if (stored.verdict, stored.publishable) != (judged.verdict, judged.publishable):
        raise PublishError(
            f"the release verdict stored in {where / distdir.MANIFEST} ({stored.verdict}, publishable "
            f"{stored.publishable}) disagrees with the verdict judged now from the evidence ({judged.badge}); "
            "the evidence or the acceptances changed since: run nox -s release_report again (with the same "
            "--accept as here)"
        )


def release_files(release: distdir.Release) -> tuple[dict[str, tuple[str, int]], list[str]]:
    """({wheel: (sha256, size)} of every wheel the release lists (SHA256SUMS and manifest.json agree, each
    re-hashed when it was opened); the .whl files in dist/ it does not list, which are never uploaded)."""
    files = {w.filename: (w.sha256, w.size) for w in release.manifest.wheels}
    unlisted = sorted(p.name for p in release.path.glob("*.whl") if p.name not in files)
    return files, unlisted


def plan_for(
    release: distdir.Release,
    index_url: str,
    *,
    add_to_existing: bool = False,
    rules_file: Path = RULES_FILE,
    dist: Path | None = None,
) -> tuple[Plan, dict[str, tuple[str, int]]]:
    """The release's plan against `index_url`, and its files; the plan notes the wheels in `dist` (the folder
    it was taken from) it leaves out."""
    files, _ = release_files(release)
    unlisted = sorted(p.name for p in (dist or release.path).glob("*.whl") if p.name not in files)
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
    accept: Iterable[str] = (),
    evidence: Path | None = None,
    after: Callable[[Path], None] | None = None,
) -> list[tuple[str, str]]:
    """Snapshot the release, judge it again, check the plan, then upload the snapshot's wheels in dependency
    order, verifying each served file by sha256: (file, what happened) for each. Nothing is uploaded when the
    verdict or the plan refuses (PublishError). `after`: run on the snapshot's folder once all went up (the
    resolution from the index compares with exactly the files that went up)."""
    t0 = time.perf_counter()
    with snapshot(dist) as release:
        t1 = time.perf_counter()
        judged = rejudge(release, accept, evidence)
        size = sum(w.size for w in release.manifest.wheels) / 2**20
        print(
            f"[publish] a snapshot of the {len(release.sums)} files SHA256SUMS lists ({size:.0f} MiB of wheels) copied "
            f"and re-hashed in {t1 - t0:.1f}s; the verdict judged again for exactly them: {judged.badge} "
            f"({time.perf_counter() - t1:.1f}s)",
            flush=True,
        )
        if plan_only:
            plan, _ = plan_for(release, index_url, add_to_existing=add_to_existing, rules_file=rules_file, dist=dist)
            print(render(plan), flush=True)
            try:
                releasable(release, judged, dist)
            except PublishError as exc:
                print(f"[publish] the verdict would refuse this release: {exc}", flush=True)
            return [(r.filename, f"plan: {r.state}") for r in plan.rows]
        releasable(release, judged, dist)
        plan, files = plan_for(release, index_url, add_to_existing=add_to_existing, rules_file=rules_file, dist=dist)
        print(render(plan), flush=True)
        if not plan.ok:
            raise PublishError(
                f"the publish plan for {index_url} is refused; nothing was uploaded:\n  " + "\n  ".join(plan.problems)
            )
        done = _upload_all(release.path, repository_url, index_url, wait_s, twine_args, files)
        if after is not None:
            after(release.path)
    return done


def _upload_all(
    snap: Path,
    repository_url: str,
    index_url: str,
    wait_s: float,
    twine_args: tuple[str, ...],
    files: dict[str, tuple[str, int]],
) -> list[tuple[str, str]]:
    """Every wheel of the snapshot up, in dependency order, each verified as served."""
    sums = {n: d for n, (d, _) in files.items()}
    done: list[tuple[str, str]] = []
    order = upload_order(snap, list(sums))
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
        _upload(snap / fname, repository_url, twine_args)
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
    p.add_argument("--repository-url", help="upload endpoint (twine --repository-url); --plan needs only --index-url")
    p.add_argument("--index-url", help="its simple index, PEP 691 or 503 (default: <repository-url>/simple/)")
    p.add_argument(
        "--accept",
        action="append",
        default=[],
        metavar="ITEM=REASON",
        help="accept a missing item of the verdict judged again here (as nox -s release -- --accept)",
    )
    p.add_argument("--evidence", type=Path, default=paths.BUILD, help="where build/verify-cp3NN.json lie")
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
    if not args.repository_url and not (args.plan and args.index_url):
        p.error("give --repository-url (where to upload), or --plan --index-url URL for a dry run")
    index = args.index_url or args.repository_url.rstrip("/") + "/simple/"
    extra: tuple[str, ...] = ("--attestations",) if args.attestations else ()
    local = "127.0.0.1" in (args.repository_url or "")
    if "TWINE_USERNAME" not in os.environ and "TWINE_PASSWORD" not in os.environ and local:
        extra += ("-u", "kt", "-p", "kt")  # a local test index takes any credentials
    status = [0]

    def after(snap: Path) -> None:
        if not args.no_verify:
            status[0] = verify_published(snap, index)

    try:
        done = publish(
            args.dist,
            args.repository_url or "",
            index,
            args.wait,
            extra,
            add_to_existing=args.add_to_existing,
            plan_only=args.plan,
            rules_file=args.rules,
            accept=args.accept,
            evidence=args.evidence,
            after=after,
        )
    except StageError as exc:  # PublishError, PlanError, and the carriers' root (unreadable wheel metadata)
        return report(exc)
    if args.plan:
        return 0
    for fname, what in done:
        print(f"{fname}: {what}")
    return status[0]


if __name__ == "__main__":
    raise SystemExit(main())
