"""Rules 1-2: wheel integrity, metadata and tag consistency."""

from __future__ import annotations

import re
from email.message import Message
from email.parser import HeaderParser

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import parse_tag
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .. import platforms
from ..manylinux import version_key
from ..model import Finding
from ..platforms import LIBC, NON_LINUX, elf_arch, elf_libc, family_of, glibc_of, tag_archs
from ..readers import ElfFacts, WheelFacts
from ._common import finding

_STRAY = re.compile(r"(^|/)(__pycache__/|CMakeFiles/|\.git/)|\.(pyc|pyo|o|obj)$|(^|/)build/(temp|lib)\.")


def _record_rows(fn: str, name: str, actual: str, size: int, listed: list[tuple[str, ...]]) -> list[Finding]:
    """wheel.record-mismatch for each RECORD row of `name` that is not its bytes: a path listed twice is
    judged row by row (an installer may take either), whichever comes first."""
    out = []
    for n, row in enumerate(listed, 1):
        digest, claimed = (row[1] if len(row) > 1 else ""), (row[2] if len(row) > 2 else "")
        if digest != actual or (claimed and claimed != str(size)):
            which = f" (row {n} of the {len(listed)} that list it)" if len(listed) > 1 else ""
            out.append(
                finding(
                    "wheel.record-mismatch",
                    fn,
                    name,
                    f"RECORD says {digest or 'no hash'}, {claimed or '?'} bytes{which}; the member is {actual}, "
                    f"{size} bytes",
                    "the file was changed after RECORD was written: rebuild the wheel rather than editing it",
                )
            )
    return out


def integrity(w: WheelFacts) -> list[Finding]:
    """RECORD against the members (missing, unlisted, phantom, mismatched), duplicates and debris."""
    out: list[Finding] = []
    fn = w.filename
    for d in w.duplicates:
        out.append(
            finding(
                "wheel.duplicate-member",
                fn,
                d,
                f"{d} appears more than once in the zip",
                "rebuild the wheel; an installer keeps only one of the copies",
            )
        )
    record_name = f"{w.dist_info}/RECORD"
    record = w.member(record_name)
    if record is None:
        out.append(
            finding(
                "wheel.record-missing",
                fn,
                record_name,
                "the wheel has no RECORD",
                "rebuild with a PEP 427 wheel builder",
            )
        )
        return out
    parsed, problem = w.record
    if problem:
        out.append(
            finding(
                "wheel.unreadable",
                fn,
                record_name,
                problem,
                "rebuild with a PEP 427 wheel builder; installers cannot read this RECORD either",
            )
        )
    rows: dict[str, list[tuple[str, ...]]] = {}  # a path listed twice keeps every row: each is checked
    for r in parsed:
        rows.setdefault(r[0], []).append(r)
    present = {m.name for m in w.members}
    for m in w.members:
        if m.name == record_name or m.name.endswith((".dist-info/RECORD.jws", ".dist-info/RECORD.p7s")):
            continue
        listed = rows.get(m.name)
        if listed is None:
            out.append(
                finding(
                    "wheel.record-unlisted",
                    fn,
                    m.name,
                    f"{m.name} is in the zip but not in RECORD",
                    "regenerate RECORD after the last change to the wheel",
                )
            )
            continue
        if not m.record_hash:  # not read: refused by a limit or unreadable, reported by its own rule
            continue
        out += _record_rows(fn, m.name, m.record_hash, m.size, listed)
    for name in rows:
        if name not in present:
            out.append(
                finding(
                    "wheel.record-phantom",
                    fn,
                    name,
                    f"RECORD lists {name}, which the wheel lacks",
                    "regenerate RECORD from the wheel's actual contents",
                )
            )
    for m in w.members:
        if _STRAY.search(m.name):
            fix = "exclude it (scikit-build-core: wheel.exclude; setuptools: MANIFEST/package_data)"
            out.append(finding("wheel.stray-content", fn, m.name, f"{m.name} is build or cache debris", fix))
        elif m.name.endswith(".a"):
            out.append(
                finding(
                    "wheel.static-library",
                    fn,
                    m.name,
                    f"{m.name} is a static archive: no loader uses it, and it only adds size",
                    "drop it from the wheel, or ship it on purpose "
                    "(for C extensions that link it) and say so in the policy",
                )
            )
    return out


def limits(w: WheelFacts) -> list[Finding]:
    """Members the reader refused to decompress (a zip bomb), and members it could not read."""
    out = [
        finding(
            "wheel.member-limit",
            w.filename,
            m.name,
            f"{m.name} {m.refused}; it was not read",
            "no real wheel member needs this: rebuild the wheel, or raise [limits] in the policy",
        )
        for m in w.members
        if m.refused
    ]
    out += [finding("wheel.unreadable", w.filename, name, why, "rebuild the wheel") for name, why in w.unreadable]
    return out


def _headers(w: WheelFacts, file: str) -> tuple[str, Message | None]:
    """(member name, parsed RFC 822 headers or None) of a .dist-info file."""
    name = f"{w.dist_info}/{file}"
    text = w.text(name)
    return name, None if text is None else HeaderParser().parsestr(text)


def _expand(tag: str) -> list[str]:
    """A compressed tag set as its tags (the line itself if it is not a tag)."""
    try:
        return [str(t) for t in parse_tag(tag)]
    except ValueError:
        return [tag]


def wheel_file(w: WheelFacts, elfs: list[ElfFacts]) -> list[Finding]:
    """The WHEEL file: Tag lines equal the filename's tags, Root-Is-Purelib fits the content."""
    fn = w.filename
    name, msg = _headers(w, "WHEEL")
    if msg is None:
        return [finding("wheel.wheel-file", fn, name, "no WHEEL file", "rebuild with a PEP 427 wheel builder")]
    out = []
    # A Tag line is one tag; a compressed one (maturin writes cp311-cp311-manylinux_2_17_x.manylinux2014_x)
    # is read expanded: installers do not read Tag lines, and the set is what must agree.
    tags = {str(t) for line in msg.get_all("Tag", []) for t in _expand(line.strip())}
    expected = {str(t) for t in w.tags}
    if tags != expected:
        out.append(
            finding(
                "wheel.wheel-file",
                fn,
                name,
                f"Tag lines {sorted(tags)} differ from the filename's tags {sorted(expected)}",
                "retag with `wheel tags` or auditwheel, which update both together",
            )
        )
    purelib = (msg.get("Root-Is-Purelib") or "").strip().lower()
    platform_specific = bool(elfs) or any(t.platform != "any" for t in w.tags)
    if purelib not in ("true", "false"):
        out.append(
            finding("wheel.wheel-file", fn, name, "Root-Is-Purelib is missing or not true/false", "rebuild the wheel")
        )
    elif (purelib == "true") == platform_specific:
        out.append(
            finding(
                "wheel.purelib",
                fn,
                name,
                f"Root-Is-Purelib: {purelib} but the wheel is {'platform-specific' if platform_specific else 'pure'}",
                "native wheels need Root-Is-Purelib: false (and pure ones true)",
            )
        )
    return out


def metadata(w: WheelFacts) -> list[Finding]:
    """METADATA: name and version equal the filename's, Requires-Dist parses, Requires-Python set."""
    fn = w.filename
    name, msg = _headers(w, "METADATA")
    if msg is None:
        return [finding("wheel.metadata", fn, name, "no METADATA", "rebuild with a PEP 427 wheel builder")]
    out = []
    meta_name, meta_version = msg.get("Name"), msg.get("Version")
    if not meta_name or not meta_version:
        return [finding("wheel.metadata", fn, name, "METADATA lacks Name or Version", "rebuild the wheel")]
    if canonicalize_name(meta_name) != w.name:
        out.append(
            finding(
                "wheel.metadata",
                fn,
                name,
                f"Name {meta_name!r} does not match the filename's {w.name!r}",
                "rename the distribution consistently (filename, METADATA, .dist-info)",
            )
        )
    try:
        if Version(meta_version) != w.version:
            out.append(
                finding(
                    "wheel.metadata",
                    fn,
                    name,
                    f"Version {meta_version} does not match the filename's {w.version}",
                    "rebuild: the filename and METADATA must carry one version",
                )
            )
    except InvalidVersion:
        out.append(
            finding("wheel.metadata", fn, name, f"Version {meta_version!r} is not PEP 440", "use a PEP 440 version")
        )
    for line in msg.get_all("Requires-Dist", []):
        try:
            Requirement(line)
        except InvalidRequirement as exc:
            out.append(
                finding(
                    "wheel.requires-dist",
                    fn,
                    name,
                    f"Requires-Dist {line!r} does not parse: {exc}",
                    "write it as a PEP 508 requirement",
                )
            )
    if not msg.get("Requires-Python"):
        out.append(
            finding(
                "wheel.requires-python",
                fn,
                name,
                "no Requires-Python",
                "set project.requires-python so old interpreters are not offered this wheel",
            )
        )
    return out


def required_names(w: WheelFacts) -> frozenset[str]:
    """Normalized names of the distributions the wheel requires (any extra)."""
    _, msg = _headers(w, "METADATA")
    names = set()
    for line in msg.get_all("Requires-Dist", []) if msg is not None else []:
        try:
            names.add(canonicalize_name(Requirement(line).name))
        except InvalidRequirement:
            continue
    return frozenset(names)


def tags(w: WheelFacts, elfs: list[ElfFacts]) -> list[Finding]:
    """Extension suffixes against the python/abi tags, plain linux_* tags, and platform overclaims."""
    out: list[Finding] = []
    fn = w.filename
    interp = {t.interpreter for t in w.tags}
    abis = {t.abi for t in w.tags}
    families = {f for t in w.tags if (f := family_of(t.platform)) in ("manylinux", "musllinux")}
    for e in elfs:
        m = re.search(r"\.(cpython-(\d+)([a-z]*)-[^.]+|abi3)\.so$", e.member)
        if not m:
            continue
        if m.group(1) == "abi3":
            # The stable ABI loads on every CPython 3.x, so a cpXY-tagged wheel may hold one; only a
            # wheel for another interpreter (pp, graalpy) cannot.
            if not any(i.startswith("cp") for i in interp):
                out.append(
                    finding(
                        "tag.ext-suffix",
                        fn,
                        e.member,
                        f"abi3 extension in a wheel for {sorted(interp)}",
                        "abi3 extensions are for CPython: tag the wheel cpXY",
                    )
                )
            continue
        # The ABI tag carries the suffix's flags: cpython-37m -> cp37m, cpython-313t -> cp313t (free-threaded).
        version, flags = m.group(2), m.group(3)
        if f"cp{version}" not in interp or f"cp{version}{flags}" not in abis:
            out.append(
                finding(
                    "tag.ext-suffix",
                    fn,
                    e.member,
                    f"extension built for CPython {version}{flags} (ABI cp{version}{flags}) in a wheel tagged "
                    f"{sorted(interp)}/{sorted(abis)}",
                    "build the wheel with the interpreter its tag names",
                )
            )
    host = [e for e in elfs if e.machine not in _DEVICE_CODE]
    for e in host:
        libc, how = elf_libc(e)
        if libc and len(families) == 1 and libc not in families:
            (tagged,) = families
            out.append(
                finding(
                    "tag.libc-mismatch",
                    fn,
                    e.member,
                    f"{how} names {LIBC[libc]}, the wheel is tagged {tagged} ({LIBC[tagged]}): it cannot be loaded "
                    "where the tag lets it install",
                    f"build it in a {tagged} image, or tag the wheel {libc}",
                )
            )
    if host and all(t.platform == "any" for t in w.tags):
        out.append(
            finding(
                "tag.native-any",
                fn,
                host[0].member,
                f"tagged for any platform but holds {len(host)} native librar{'ies' if len(host) > 1 else 'y'} "
                f"({host[0].machine}): an installer puts it on every OS and CPU",
                "build a platform wheel (scikit-build-core/setuptools with the extension declared), then "
                "`auditwheel repair`",
            )
        )
    if elfs and not any(glibc_of(t.platform) for t in w.tags) and any(t.platform.startswith("linux_") for t in w.tags):
        msg = "native wheel tagged linux_*: no installer will take it from an index"
        out.append(
            finding("tag.not-portable", fn, "", msg, "run `auditwheel repair` (nox -s build_cpu does)", "warning")
        )
    return out + platform_overclaims(w, elfs)


def platform_overclaims(w: WheelFacts, elfs: list[ElfFacts]) -> list[Finding]:
    """What the wheel's most portable claimed tag does not allow (any ELF it ships, the CUDA payload's
    included): a symbol version, an ISA level above baseline, a forbidden symbol. Read from the same policy
    objects as the platform verdict (audits.platforms), for the wheel's own architecture."""
    plats = [t.platform for t in w.tags]
    target, _ = platforms.target(plats, elfs)
    if target is None:
        return []
    pol, platform = platforms.claimed_policy(target, plats)
    if pol is None:
        return []
    arch = target.arch
    out: list[Finding] = []
    fix = "let `auditwheel repair` choose the tag, or build in an older manylinux image"
    for e in elfs:
        if platforms.elf_arch(e)[0] != arch:
            continue  # another architecture's file: tag.arch rules judge it, no policy of this one does
        # One finding per library and limiting reason (its newest version needed), with the count.
        over: dict[tuple[str, str], list[str]] = {}
        for lib, versions in e.version_needs:
            for v in versions:
                if not pol.admits(v):
                    over.setdefault((lib, v.partition("_")[0]), []).append(v)
        for (lib, prefix), vs in sorted(over.items()):
            worst = max(vs, key=version_key)
            need = next((p.name for p in target.policies if p.admits(worst)), f"none known to auditwheel for {arch}")
            # The newest *numbered* version the tag allows (CXXABI also lists FLOAT128 and TM_1).
            numbered = [x for x in pol.symbol_versions.get(prefix, ()) if re.fullmatch(r"\d+(\.\d+)*", x)]
            allowed = (
                f"its newest {prefix} on {arch} is {prefix}_{max(numbered, key=version_key)}"
                if numbered
                else (f"it allows no {prefix} version on {arch}")
            )
            more = f" and {len(vs) - 1} more {prefix} version{'s' if len(vs) > 2 else ''}" if len(vs) > 1 else ""
            out.append(
                finding(
                    "tag.manylinux-overclaim",
                    w.filename,
                    e.member,
                    f"needs {worst}{more} from {lib}, which {platform} does not allow ({allowed}); the lowest tag "
                    f"allowing it is {need}",
                    fix,
                )
            )
        if e.isa_needed and e.machine == "EM_X86_64":
            out.append(
                finding(
                    "tag.isa-level",
                    w.filename,
                    e.member,
                    f"declares {e.isa_needed} in its GNU property note (GNU_PROPERTY_X86_ISA_1_NEEDED): no manylinux "
                    f"tag allows an ISA level above x86-64 baseline, and {platform} claims one",
                    "build without -march=x86-64-vN (dispatch at run time, as kt-kernel's CPU variants do), or "
                    "drop the note with -Wl,-z,x86-64-baseline",
                )
            )
        used = set(e.forbidden_candidates)
        uses = sorted((lib, sym) for lib in e.needed for sym in used & pol.blacklist.get(lib, frozenset()))
        if uses:
            shown = ", ".join(f"{s} ({lib})" for lib, s in uses[:5]) + (
                f" and {len(uses) - 5} more" if len(uses) > 5 else ""
            )
            out.append(
                finding(
                    "tag.forbidden-symbol",
                    w.filename,
                    e.member,
                    f"uses {shown}, which {platform} forbids (auditwheel's policy: a symbol private to the system "
                    "library, or one that differs between distributions)",
                    "build in the manylinux image of the tag (or a newer tag's), or vendor the library",
                )
            )
    return out


def _unsafe(path: str) -> str:
    """Why `path` is unsafe to install, or ""."""
    if "\x00" in path:
        return "contains a NUL byte"
    if "\\" in path:
        return "contains a backslash (a directory separator on Windows, a file name character elsewhere)"
    if path.startswith("/") or re.match(r"[A-Za-z]:", path):
        return "is absolute"
    if ".." in path.split("/"):
        return "climbs out of the install root (..)"
    return ""


def safety(w: WheelFacts) -> list[Finding]:
    """Member and RECORD paths that would install outside site-packages or collide; link and
    special-file entries (an installer may follow or create them)."""
    out: list[Finding] = []
    fn = w.filename
    fix = "rebuild the wheel with a PEP 427 builder; never add members by hand"
    seen: dict[str, str] = {}
    for m in w.members:
        why = _unsafe(m.name)
        if why:
            out.append(finding("wheel.unsafe-path", fn, m.name, f"member path {m.name!r} {why}", fix))
        folded = m.name.casefold()
        if folded in seen and seen[folded] != m.name:
            out.append(
                finding(
                    "wheel.unsafe-path",
                    fn,
                    m.name,
                    f"{m.name!r} and {seen[folded]!r} differ only in "
                    "case: one overwrites the other on a case-insensitive file system",
                    fix,
                )
            )
        seen.setdefault(folded, m.name)
        if m.kind != "file":
            what = "symbolic link" if m.kind == "link" else "special file"
            out.append(
                finding(
                    "wheel.link-member",
                    fn,
                    m.name,
                    f"{m.name!r} is a {what} entry",
                    "store regular files only; installers disagree on links and may follow one "
                    "outside the install root",
                )
            )
    for row in w.record[0]:
        if why := _unsafe(row[0]):
            out.append(finding("wheel.unsafe-path", fn, f"{w.dist_info}/RECORD", f"RECORD path {row[0]!r} {why}", fix))
    return out


_LINUX_ABIS = {"ELFOSABI_SYSV", "ELFOSABI_LINUX"}
# ELF machines of GPU code (sglang ships AMD gfx950 code objects; cubins are EM_CUDA)
_DEVICE_CODE = {"EM_AMDGPU", "EM_CUDA"}


def architecture(w: WheelFacts, elfs: list[ElfFacts], non_elf: list[str]) -> list[Finding]:
    """Every ELF file is built for the architecture the platform tag names; a .so member is ELF."""
    out: list[Finding] = []
    fn = w.filename
    archs = {a for t in w.tags for a in tag_archs(t.platform)}
    for e in elfs:
        if e.machine in _DEVICE_CODE:  # GPU code objects ride as data; the GPU runtime loads them
            continue
        if e.osabi not in _LINUX_ABIS:
            out.append(finding("elf.arch-mismatch", fn, e.member, f"OS ABI {e.osabi}, not Linux", "build it for Linux"))
        if not archs:
            continue
        got, why = elf_arch(e)
        if got not in archs:
            want = ", ".join(sorted(archs))
            what = why or (f"{e.machine} ELF{e.elfclass} {'little' if e.little_endian else 'big'}-endian ({got} code)")
            out.append(
                finding(
                    "elf.arch-mismatch",
                    fn,
                    e.member,
                    f"{what} in a wheel tagged for {want}",
                    f"build it for {want}, or tag the wheel for the architecture it holds",
                )
            )
    # A macOS or iOS wheel's libraries are Mach-O, which no rule here reads (auditwheel neither).
    foreign = bool(w.tags) and all(family_of(t.platform) in NON_LINUX for t in w.tags)
    for name in [] if foreign else non_elf:
        out.append(
            finding(
                "elf.not-elf",
                fn,
                name,
                f"{name} is named like a shared library but is not ELF",
                "ship the real library, or name the file for what it is",
            )
        )
    return out


def layout(w: WheelFacts, elfs: dict[str, str], forbidden: frozenset[str]) -> list[Finding]:
    """Top-level directories that are not packages (lib/, include/ in site-packages), and the same
    shared library stored several times (x.so, x.so.0, x.so.0.6.0 with identical bytes).
    `elfs`: ELF member -> its sha256."""
    out: list[Finding] = []
    fn = w.filename
    tops = sorted({m.name.split("/", 1)[0] for m in w.members if "/" in m.name})
    for top in tops:
        if top in forbidden:
            out.append(
                finding(
                    "wheel.top-level",
                    fn,
                    f"{top}/",
                    f"{top}/ installs straight into site-packages, beside every other distribution",
                    f"move it into the import package, or under "
                    f"{w.dist_info.removesuffix('.dist-info')}.data/ (data, headers, scripts)",
                )
            )
    by_hash: dict[str, list[str]] = {}
    for name, digest in sorted(elfs.items()):
        by_hash.setdefault(digest, []).append(name)
    for names in by_hash.values():
        if len(names) > 1:
            out.append(
                finding(
                    "wheel.duplicate-library",
                    fn,
                    names[0],
                    f"the same library bytes are stored {len(names)} times: {', '.join(names)}",
                    "ship one file; wheels cannot hold "
                    "symlinks, so give the loader one name (the SONAME) and drop the copies",
                )
            )
    return out


def collisions(installed: dict[str, tuple[str, ...]]) -> list[Finding]:
    """Paths two distributions of the release both install (one silently overwrites the other).
    `installed`: wheel filename -> its member paths."""
    owner: dict[str, str] = {}
    out: list[Finding] = []

    def dist(wheel: str) -> str:  # wheels of one distribution (cp311, cp312) never install together
        return wheel.split("-", 1)[0].lower()

    for wheel, names in sorted(installed.items()):
        for name in names:
            top = name.split("/", 1)[0]
            if top.endswith((".dist-info", ".data")):
                continue
            if name in owner and dist(owner[name]) != dist(wheel):
                out.append(
                    finding(
                        "release.path-collision",
                        wheel,
                        name,
                        f"{owner[name]} installs {name} too: "
                        "whichever installs last wins, and uninstalling either breaks the other",
                        "ship the file from one distribution only",
                    )
                )
            owner.setdefault(name, wheel)
    return out
