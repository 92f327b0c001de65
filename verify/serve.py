"""The serve profile: a real install of the published dist/install/serve-cp3XX.txt by hash, as users
get it (ktransformers[serve], the CUDA torch and NVIDIA runtime wheels included), pip check, the payload
materialized from the installed carriers and re-verified, every DT_NEEDED of every extracted library
resolved inside the environment, and how far `import sglang` gets on this host."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from base.interpreters import Interpreter
from carriers.graph import closure

from . import owners
from .profiles import root
from .venv import (
    VerifyError,
    clean_env,
    doctor_run,
    fresh_venv,
    install_published,
    pip_check,
    run_probe,
)


def _env_libraries(venv: Path) -> dict[str, Path]:
    """soname/basename -> path of every shared library installed in the venv (torch/lib, nvidia/*/lib, ...)."""
    libs: dict[str, Path] = {}
    for site in (venv / "lib").glob("python3*/site-packages"):
        for so in sorted(site.rglob("*.so*")):
            if so.is_file():
                libs.setdefault(so.name, so)
    return libs


def _system_libraries() -> set[str]:
    proc = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in proc.stdout.splitlines()[1:] if line.strip()}


def unresolved_needed(root: Path, venv: Path, always_external: set[str]) -> dict[str, list[str]]:
    """Every extracted ELF's DT_NEEDED that resolves nowhere: not beside it through its
    RUNPATH/RPATH ($ORIGIN), not in the environment, not a system library, not the driver."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    env = _env_libraries(venv)
    system = _system_libraries()
    missing: dict[str, list[str]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with path.open("rb") as fh:
            if fh.read(4) != b"\x7fELF":
                continue
            fh.seek(0)
            elf = ELFFile(fh)
            needed, paths = [], []
            for sec in elf.iter_sections():
                if isinstance(sec, DynamicSection):
                    for tag in sec.iter_tags():
                        if tag.entry.d_tag == "DT_NEEDED":
                            needed.append(tag.needed)  # type: ignore[attr-defined]
                        elif tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                            paths += [
                                d.replace("$ORIGIN", str(path.parent))
                                for d in getattr(tag, "runpath", getattr(tag, "rpath", "")).split(":")
                            ]
        for lib in needed:
            if lib in always_external or lib in system or lib in env or any((Path(d) / lib).exists() for d in paths):
                continue
            missing.setdefault(str(path.relative_to(root)), []).append(lib)
    return missing


def serving_problems(found: dict[str, Any]) -> list[str]:
    """What verify/probes/serving.py found wrong: the first differing text and ids, a special token
    that does not map, the chat template, a grammar case decided wrongly, CPU masking that fails."""
    tok, grammar = found["tokenizer"], found["json_schema"]
    wrong = [
        f"SGLang's tokenizer differs from tiktoken on {m['text']!r} (split_special_tokens="
        f"{m.get('split_special_tokens')}) at id {m.get('at')}: got {m.get('got')}, want {m.get('want')}"
        for m in tok["mismatches"]
    ]
    wrong += [f"special token {t!r} does not map to its id and back" for t in tok["special_wrong"]]
    if not tok["chat_template_equal"]:
        wrong.append(
            f"the chat template renders other ids than the manual construction: {tok.get('chat_template_difference')}"
        )
    if not grammar["valid"]["accepted"]:
        wrong.append(f"the JSON-schema grammar rejects a valid document: {grammar['valid']}")
    wrong += [
        f"the JSON-schema grammar accepts the {k} document" for k, r in grammar["invalid"].items() if r["accepted"]
    ]
    if grammar["strict_thinking"] != "ok":
        wrong.append(f"strict thinking on CPU logits: {grammar['strict_thinking']}")
    return wrong


def serving_checks(venv: Path, work: Path) -> dict[str, Any]:
    """verify/probes/serving.py in the venv: a Kimi-style tokenizer through SGLang's factory and
    JSON-schema grammars on CPU logits; VerifyError naming the first difference."""
    found: dict[str, Any] = run_probe(
        venv, "SGLang tokenizer and JSON-schema grammar on CPU", "serving", str(work / "serving")
    )
    if wrong := serving_problems(found):
        raise VerifyError("serving on CPU through SGLang:\n  " + "\n  ".join(wrong))
    tok, grammar = found["tokenizer"], found["json_schema"]
    return {
        "tokenizer": {k: tok[k] for k in ("native_equal", "corpus_texts", "ids_compared", "special_tokens", "class")},
        "json_schema": {k: grammar[k] for k in ("accepted", "rejected", "strict_thinking")},
        "seconds": found["seconds"],
    }


def verify_serve(dist: Path, work: Path, interpreter: Interpreter) -> dict[str, Any]:
    """The serve profile on `interpreter`, installed for real and proven (the module's docstring)."""
    venv = fresh_venv(work / "serve", interpreter)
    reached, _ = closure(dist, root("serve"))
    t0 = time.perf_counter()
    # dist/install/serve-cp3XX.txt of the interpreter's Python, as users get it
    got, exercised = install_published(venv, dist, "serve", python=interpreter.python)
    install_s = time.perf_counter() - t0
    names = sorted(got)
    torch = got.get("torch") or "?"
    upstream = [n for n in names if n in owners.upstream()]
    if upstream:
        raise VerifyError(f"the serve closure installs upstream {upstream} beside the forks")
    missing = sorted(set(reached) - set(names))
    if missing:
        raise VerifyError(f"the serve closure lacks the carriers {missing}")
    pip_check(venv)
    shared = owners.check_collisions(venv)
    cache = work / "serve-payload-cache"
    shutil.rmtree(cache, ignore_errors=True)
    run_env = {**clean_env(), "KT_KERNEL_CACHE_DIR": str(cache)}
    py = str(venv / "bin" / "python")
    t1 = time.perf_counter()
    mat = subprocess.run(
        [py, "-m", "kt_kernel.payload", "materialize"], capture_output=True, text=True, check=False, env=run_env
    )
    if mat.returncode != 0:
        raise VerifyError(f"the payload does not materialize from the installed carriers:\n{mat.stderr[-3000:]}")
    materialize_s = time.perf_counter() - t1
    payload = Path(mat.stdout.strip())
    ver = subprocess.run(
        [py, "-m", "kt_kernel.payload", "verify"], capture_output=True, text=True, check=False, env=run_env
    )
    if ver.returncode != 0:
        raise VerifyError(f"the extracted payload differs from its manifest:\n{ver.stderr[-3000:]}")
    unresolved = unresolved_needed(payload, venv, {"libcuda.so.1"})
    if unresolved:
        raise VerifyError(f"extracted libraries need what the serve environment does not provide: {unresolved}")
    serving = serving_checks(venv, work)
    doctor = doctor_run(venv, env=run_env)
    deep = doctor_run(venv, "--deep", env=run_env)
    imports: dict[str, str] = run_probe(venv, "sglang import probe", "sglang_imports")
    for mod in ("sglang", "xgrammar", "sglang.srt.constrained.xgrammar_backend"):  # CPU-only: sgl_kernel may not
        if imports.get(mod) != "ok":
            raise VerifyError(f"import {mod} fails in the serve environment: {imports.get(mod)}")
    return {
        "install_file": exercised,
        "resolved": len(names),
        "carriers": sorted(set(reached)),
        "upstream": upstream,
        "install_s": round(install_s, 1),
        "materialize_s": round(materialize_s, 1),
        "payload_files": sum(1 for p in payload.rglob("*") if p.is_file() and p.name != ".complete"),
        "needed_unresolved": unresolved,
        "imports": imports,
        "shared_paths": shared,
        "torch": torch,
        "tokenizer": serving["tokenizer"],
        "json_schema": serving["json_schema"],
        "doctor": {**doctor, "deep_seconds": deep["seconds"]},
    }
