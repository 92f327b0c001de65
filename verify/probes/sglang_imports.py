"""How far `import sglang`, `sglang.srt.server_args`, `sgl_kernel`, xgrammar and SGLang's xgrammar
grammar backend get on this host: "ok" or the first cause of the failure. One JSON line."""

import json

MARK = "Error details from previous import attempts:"  # sgl_kernel lists each load attempt after it
out = {}
for mod in ("sglang", "sglang.srt.server_args", "sgl_kernel", "xgrammar", "sglang.srt.constrained.xgrammar_backend"):
    try:
        __import__(mod)
        out[mod] = "ok"
    except BaseException as exc:  # report exactly how far a CPU-only host gets
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        after = lines[lines.index(MARK) + 1 :] if MARK in lines else []
        # the first attempt's error already names its exception type
        first = after[0].lstrip("- ") if after else f"{type(exc).__name__}: {lines[-1] if lines else ''}"
        out[mod] = first[:300]
print(json.dumps(out))
