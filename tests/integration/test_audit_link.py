"""Link-level rules on ELF files built with exactly their defect: an abi3 extension outside the limited API, torch's
C++ ABI under a range, and undefined symbols that bind nowhere in the providers given (--link); and the real
sgl_kernel common_ops against the torch the release pins and an older one."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from audits import audit_wheel, load_policy, run
from audits.analyzers import link_rules
from audits.readers._dynsym import read_dynsym
from tests.wheelkit import compile_so, pure_wheel_members, write_wheel

POLICY = load_policy()


def _wheel(tmp_path: Path, tag: str, so: dict[str, bytes], requires: tuple[str, ...] = ()) -> Path:
    members = pure_wheel_members(requires=requires)
    members.update({f"demo_pkg/{name}": data for name, data in so.items()})
    di = "demo_pkg-1.0.dist-info/WHEEL"
    members[di] = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()
    return write_wheel(tmp_path / f"demo_pkg-1.0-{tag}.whl", members)


def _errors(path: Path, rule: str, also: frozenset[str] = frozenset()) -> list[str]:
    """The messages of `rule`'s errors, where the wheel has no other error (but `also`): exactly its defect."""
    errors = [f for f in audit_wheel(path, POLICY).findings if f.severity == "error"]
    assert {f.rule for f in errors} - also <= {rule} <= {"abi3.limited-api", "torch.abi-pin"}
    return [f.message for f in errors if f.rule == rule]


def _abi3_errors(tmp_path: Path, python: str, function: str) -> list[str]:
    """abi3.limited-api errors of a cp3NN-abi3 wheel whose extension calls `function`."""
    src = f"void *PyInit_fast(void) {{ return 0; }}\nextern void *{function}(void *);\n"
    src += f"void *f(void *o) {{ return {function}(o); }}\n"
    so = compile_so(tmp_path, "fast.abi3.so", src)
    return _errors(_wheel(tmp_path, f"{python}-abi3-manylinux_2_17_x86_64", {"fast.abi3.so": so}), "abi3.limited-api")


def test_an_abi3_extension_using_a_private_function_is_outside_the_limited_api(tmp_path: Path) -> None:
    (msg,) = _abi3_errors(tmp_path, "cp311", "_PyObject_GetDictPtr")
    assert "uses 1 symbols outside the stable ABI: _PyObject_GetDictPtr" in msg


def test_an_abi3_extension_using_a_newer_function_than_its_tag_names(tmp_path: Path) -> None:
    """PyType_GetName came with 3.11: fine under cp311-abi3, an error under cp310-abi3."""
    (msg,) = _abi3_errors(tmp_path, "cp310", "PyType_GetName")
    assert "PyType_GetName (3.11), newer than the 3.10 its tag names" in msg
    assert _abi3_errors(tmp_path, "cp311", "PyType_GetName") == []


def _torch_stub(tmp_path: Path, body: str = "") -> Path:
    folder = tmp_path / "torch" / "lib"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "libtorch.so").write_bytes(
        compile_so(tmp_path, "libtorch.so", body + "int torch_stub;\n", "-Wl,-soname,libtorch.so")
    )
    return folder


CXX_USER = """
extern void c10_check(void) __asm__("_ZN3c106detail14torchCheckFailEPKcS2_jS2_");
void use(void) { c10_check(); }
"""
STABLE_USER = "extern void *aoti_torch_empty_strided(void);\nvoid *use(void) { return aoti_torch_empty_strided(); }\n"


@pytest.mark.parametrize(
    ("source", "requires", "bad"),
    [
        (CXX_USER, ("torch>=2.4",), "but the wheel requires torch>=2.4"),
        (CXX_USER, (), "but the wheel does not require torch"),
        (CXX_USER, ("torch==2.14.1",), ""),
        (STABLE_USER, ("torch>=2.4",), ""),  # PyTorch's stable C ABI (torchaudio 2.11's case): a range serves
    ],
)
def test_torch_cxx_abi_needs_an_exact_torch(tmp_path: Path, source: str, requires: tuple[str, ...], bad: str) -> None:
    lib = _torch_stub(tmp_path)
    so = compile_so(tmp_path, "ops.so", source, f"-L{lib}", "-Wl,--no-as-needed", "-ltorch")
    # without a torch requirement, nothing provides libtorch.so either (rpath.unresolved)
    also = frozenset({"rpath.unresolved"}) if not requires else frozenset()
    found = _errors(_wheel(tmp_path, "py3-none-manylinux_2_17_x86_64", {"ops.so": so}, requires), "torch.abi-pin", also)
    if not bad:
        assert found == []
        return
    (msg,) = found
    assert "binds 1 symbols of torch's C++ ABI (c10::detail::torchCheckFail(char const*, char const*, unsigned" in msg
    assert bad in msg


def test_a_symbol_the_provided_libtorch_lacks_is_unresolved_and_one_it_has_binds(tmp_path: Path) -> None:
    lib = _torch_stub(tmp_path)  # defines no c10 symbol
    so = compile_so(tmp_path, "ops.so", CXX_USER, f"-L{lib}", "-Wl,--no-as-needed", "-ltorch")
    wheel = _wheel(tmp_path, "py3-none-manylinux_2_17_x86_64", {"ops.so": so}, ("torch==2.14.1",))
    report = run([wheel], POLICY, link=[tmp_path / "torch"])
    (f,) = [f for f in report["findings"] if f["rule"] == "link.unresolved"]
    assert f["member"] == "demo_pkg/ops.so"
    assert "1 undefined symbols bind nowhere in its load scope (given): c10::detail::torchCheckFail(" in f["message"]
    _torch_stub(
        tmp_path,
        'void c10_check(void) __asm__("_ZN3c106detail14torchCheckFailEPKcS2_jS2_");\nvoid c10_check(void) {}\n',
    )
    assert [
        f for f in run([wheel], POLICY, link=[tmp_path / "torch"])["findings"] if f["rule"].startswith("link.")
    ] == []


def test_a_symbol_version_the_provider_lacks_is_unresolved(tmp_path: Path) -> None:
    """The extension was linked against libx's X_3 version of x_call; the provider found defines only X_2."""

    def libx(folder: Path, version: str) -> None:
        folder.mkdir(parents=True)
        (tmp_path / f"{version}.map").write_text(f"{version} {{ global: x_call; local: *; }};\n")
        script = f"-Wl,--version-script={tmp_path / f'{version}.map'}"
        src = "int x_call(void) { return 3; }\n"
        (folder / "libx.so.1").write_bytes(
            compile_so(tmp_path, f"libx-{version}.so", src, "-Wl,-soname,libx.so.1", script)
        )

    libx(tmp_path / "built", "X_3")
    src = "extern int x_call(void);\nint use(void) { return x_call(); }\n"
    so = compile_so(tmp_path, "ops.so", src, f"-L{tmp_path / 'built'}", "-l:libx.so.1")
    assert ("x_call", "X_3", "libx.so.1") in read_dynsym("ops.so", io.BytesIO(so)).undefined
    libx(tmp_path / "site" / "x" / "lib", "X_2")
    wheel = _wheel(tmp_path, "py3-none-manylinux_2_17_x86_64", {"ops.so": so})
    (f,) = [f for f in run([wheel], POLICY, link=[tmp_path / "site"])["findings"] if f["rule"] == "link.unresolved"]
    assert "x_call; versions asked: X_3 (libx.so.1)" in f["message"]


def test_a_library_no_provider_holds_is_one_finding(tmp_path: Path) -> None:
    lib = tmp_path / "elsewhere"
    lib.mkdir()
    (lib / "libgone.so").write_bytes(
        compile_so(
            tmp_path, "libgone.so", "int g1(void){return 1;} int g2(void){return 2;}\n", "-Wl,-soname,libgone.so"
        )
    )
    so = compile_so(
        tmp_path, "ops.so", "int g1(void); int g2(void);\nint use(void) { return g1() + g2(); }\n", f"-L{lib}", "-lgone"
    )
    wheel = _wheel(tmp_path, "py3-none-manylinux_2_17_x86_64", {"ops.so": so})
    empty = tmp_path / "empty"
    empty.mkdir()
    found = [f for f in run([wheel], POLICY, link=[empty])["findings"] if f["rule"].startswith("link.")]
    assert [(f["rule"], f["member"]) for f in found] == [("link.provider-missing", "demo_pkg/ops.so")]
    assert "needs libgone.so, which neither the wheel nor the providers" in found[0]["message"]


# --- the real sgl_kernel extension against real torch libraries ------------------------------------

UV_ARCHIVE = Path.home() / ".cache" / "uv" / "archive-v0"


def _unpacked(dist_info: str) -> Path | None:
    """A distribution uv unpacked on this machine (its archive), by its dist-info folder name."""
    found = sorted(UV_ARCHIVE.glob(f"*/{dist_info}"))
    return found[0].parent if found else None


def _providers(torch: str) -> list[Path] | None:
    """torch/lib of that torch and the CUDA 13 libraries sgl_kernel links (uv's unpacked copies), or None."""
    top = _unpacked(f"torch-{torch}.dist-info")
    libs = [sorted(UV_ARCHIVE.glob(f"*/nvidia/cu13/lib/{n}")) for n in NV13]
    if top is None or not all(libs):
        return None
    return [top / "torch" / "lib", *{found[0].parent for found in libs}]


NV13 = ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libnvrtc.so.13")


@pytest.fixture(scope="module")
def common_ops() -> bytes:
    wheels = sorted((Path.home() / ".cache" / "kt-release" / "inputs" / "sglang-kernel").glob("*.whl"))
    if not wheels:
        pytest.skip("no sglang-kernel input wheel in ~/.cache/kt-release/inputs (nox -s build_all downloads it)")
    import zipfile

    with zipfile.ZipFile(wheels[0]) as zf:
        return zf.read("sgl_kernel/sm90/common_ops.abi3.so")


@pytest.mark.parametrize(("torch", "unresolved"), [("2.14.1", 0), ("2.9.1", 11)])
def test_the_real_common_ops_binds_in_the_pinned_torch_and_not_in_an_older_one(
    common_ops: bytes, torch: str, unresolved: int
) -> None:
    """sglang-kernel 0.4.10's sm90 common_ops: every symbol binds in torch 2.14.1 (the release's pin); torch 2.9.1
    lacks 11 of its c10/torch symbols, which are named."""
    roots = _providers(torch)
    if roots is None:
        pytest.skip(
            f"torch {torch} (CUDA) and {', '.join(NV13)} are not unpacked in {UV_ARCHIVE} (uv pip install them once)"
        )
    from audits import platforms

    providers = link_rules.Providers.scan(roots)
    obj = read_dynsym("sgl_kernel/sm90/common_ops.abi3.so", io.BytesIO(common_ops))
    r = link_rules.resolve(obj, {}, providers, platforms.system_libraries_of_tags(["manylinux_2_28_x86_64"]))
    assert (len(r.unresolved), r.missing) == (unresolved, [])
    if unresolved:
        names = [link_rules.demangle(n) for n, _, _ in r.unresolved]
        assert "c10::cuda::CUDAErrorLogCapture::CUDAErrorLogCapture()" in names
    else:
        assert r.bound == 143


def test_a_provider_library_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    lib = tmp_path / "built"
    lib.mkdir()
    (lib / "libgone.so").write_bytes(
        compile_so(tmp_path, "libgone.so", "int g1(void){return 1;}\n", "-Wl,-soname,libgone.so")
    )
    so = compile_so(tmp_path, "ops.so", "int g1(void);\nint use(void) { return g1(); }\n", f"-L{lib}", "-lgone")
    site = tmp_path / "site" / "gone" / "lib"
    site.mkdir(parents=True)
    (site / "libgone.so").write_bytes(b"\x7fELF" + b"\x02\x01\x01" + b"\0" * 9 + b"\xff" * 40)  # a header, then junk
    wheel = _wheel(tmp_path, "py3-none-manylinux_2_17_x86_64", {"ops.so": so})
    found = [f for f in run([wheel], POLICY, link=[tmp_path / "site"])["findings"] if f["rule"].startswith("link.")]
    (f,) = found
    assert f["rule"] == "link.provider-missing"
    assert f"needs a library the providers hold but the audit cannot read: {site / 'libgone.so'}" in f["message"]
