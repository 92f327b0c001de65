"""Lookups by distribution name (code asks version("peft") and a fork installs as peft-kt): every
renamed upstream in the venv must answer with the upstream's name and version, and the sites the
release's audit found (dist.name-lookup) must see it: trl's __version__, accelerate's and
transformers' "is peft available", transformers' require_version. One JSON line."""

import json
from importlib.metadata import distributions, metadata, version
from typing import Any

out: dict[str, Any] = {"lookups": {}}
for d in distributions():
    up = d.read_text("kt_upstream.json")
    if up:
        up = json.loads(up)
        out["lookups"][up["name"]] = {
            "want": [up["name"], up["version"]],
            "got": [metadata(up["name"])["Name"], version(up["name"])],
        }
import trl  # noqa: E402  (after the listing: importing must not change what it shows)
from accelerate.utils import is_peft_available as accelerate_sees_peft  # noqa: E402
from transformers.utils import is_peft_available as transformers_sees_peft  # noqa: E402
from transformers.utils.versions import require_version  # noqa: E402

require_version("peft>=0.1")
out["sites"] = {
    "trl.__version__": trl.__version__,
    "accelerate is_peft_available": accelerate_sees_peft(),
    "transformers is_peft_available": transformers_sees_peft(),
    "require_version": "ok",
}
print(json.dumps(out))
