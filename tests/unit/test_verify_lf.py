"""verify_lf's judgements on control results and owners, hermetically (the real runs are in
tests/integration/test_lf_profiles.py)."""

from __future__ import annotations

from typing import Any

from verify.lf import control_problems, install_problems, ownership_problems, upgrade_problems
from verify.venv import uv_installed


def _run(**kw: Any) -> dict[str, Any]:
    r = {"kt_blocks": 2, "blocks": 2, "losses": [1.0, 0.5], "resumed_losses": [1.0, 0.5], "resume_diffs": []}
    r["expert_adapter_saved"] = True
    return r | kw


def test_a_clean_kt_run_passes_and_each_defect_is_named() -> None:
    assert control_problems(_run(), kt=True) == []
    assert control_problems(_run(kt_blocks=0), kt=False) == []
    assert "expected 2 (use_kt=True)" in control_problems(_run(kt_blocks=1), kt=True)[0]
    assert "expected 0 (use_kt=False)" in control_problems(_run(), kt=False)[0]
    assert control_problems(_run(resume_diffs=["optimizer.pt: 1 of 9 tensors differ"]), kt=True) == [
        "resumed run differs: optimizer.pt: 1 of 9 tensors differ"
    ]
    assert "resumed [1.0, 0.6]" in control_problems(_run(resumed_losses=[1.0, 0.6]), kt=True)[0]
    assert "kt_expert_adapter" in control_problems(_run(expert_adapter_saved=False), kt=True)[0]


def test_ownership_wants_one_owner_of_the_right_kind() -> None:
    fork = {"name": "peft-kt", "version": "0.21.2", "kt": True}
    up = {"name": "peft", "version": "0.21.2", "kt": False}
    assert ownership_problems({"peft": [fork]}, kt=True) == []
    assert ownership_problems({"peft": [up]}, kt=False) == []
    assert "not by exactly one" in ownership_problems({"peft": [fork, up]}, kt=True)[0]
    assert "not by exactly one" in ownership_problems({"peft": []}, kt=True)[0]
    assert "not by the KT distribution" in ownership_problems({"peft": [up]}, kt=True)[0]
    assert "not by the upstream distribution" in ownership_problems({"peft": [fork]}, kt=False)[0]


def test_installed_reads_uv_output() -> None:
    out = "Resolved 3 packages\n + torch==2.14.1\n + Llama_Factory==0.9.5\n - datasets==4.0.0\n + datasets==5.2.0\n"
    assert uv_installed(out) == {"torch": "2.14.1", "llama-factory": "0.9.5", "datasets": "5.2.0"}
    assert uv_installed(" + kt-kernel @ file:///d/kt_kernel-0.6.1-cp311.whl\n") == {"kt-kernel": ""}


def test_each_profile_refuses_the_other_kind_of_distribution() -> None:
    standard = {"torch": "2.14.1", "transformers": "4.57.1", "llamafactory": "0.9.5"}
    assert install_problems(standard, kt=False) == []
    assert install_problems(standard | {"peft-kt": "0.21.2.post1"}, kt=False) == [
        "the standard profile installs KT distribution peft-kt 0.21.2.post1"
    ]
    assert install_problems(standard | {"kt-kernel": "0.6.1"}, kt=False)[0].endswith("kt-kernel 0.6.1")
    kt = {"torch": "2.14.1", "transformers-kt": "5.19.0.post1", "kt-kernel": "0.6.1", "llamafactory-kt": "0.9.5.post1"}
    carriers = ["kt-kernel", "transformers-kt", "llamafactory-kt"]
    assert install_problems(kt, kt=True, carriers=carriers) == []
    assert install_problems(kt | {"transformers": "5.19.0"}, kt=True, carriers=carriers) == [
        "the lf-kt profile installs upstream transformers 5.19.0 beside its fork"
    ]
    assert install_problems(kt, kt=True, carriers=[*carriers, "sglang-kt"]) == [
        "the lf-kt profile lacks carrier sglang-kt"
    ]


def test_the_upgrade_needs_every_conflict_reported_and_pip_repairs() -> None:
    every = ["accelerate", "llamafactory", "peft", "transformers", "trl"]
    repairs = ["pip uninstall -y peft", "pip install --force-reinstall --no-deps peft-kt==0.21.2.post1"]
    assert upgrade_problems(every, repairs) == []
    assert upgrade_problems([p for p in every if p != "trl"], repairs) == [
        "kt-doctor does not report trl/, which upstream and its fork both write after the upgrade"
    ]
    assert upgrade_problems(every, ["rm -rf site-packages/peft"]) == [
        "kt-doctor printed a repair that is not a pip command: rm -rf site-packages/peft"
    ]
