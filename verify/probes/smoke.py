"""The sft profile's imports: each module's version and the distribution that installed it (a fork:
trl-kt, with its own version), kt_kernel's CPU variant and torch's version. One JSON line."""

import importlib
import json
from importlib.metadata import packages_distributions, version
from typing import Any

out: dict[str, Any] = {"imports": {}, "distributions": {}}
owners = packages_distributions()
for mod in ("kt_kernel", "transformers", "accelerate", "peft", "trl", "torch"):
    m = importlib.import_module(mod)
    out["imports"][mod] = getattr(m, "__version__", "?")
    dist = sorted(owners.get(mod, []))
    out["distributions"][mod] = f"{dist[0]} {version(dist[0])}" if dist else "?"
import kt_kernel  # noqa: E402
import torch  # noqa: E402

out["cpu_variant"] = kt_kernel.__cpu_variant__
out["torch"] = torch.__version__
print(json.dumps(out))
