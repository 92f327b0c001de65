"""LlamaFactory's own view of the environment: its dependency check (patched to the fork's declared
bounds) and its version gates, which read version("transformers") through the release's alias.
One JSON line."""

import json

import transformers
import xgrammar  # SGLang's JSON-schema grammars: its library is found through importlib.metadata
from llamafactory.extras.misc import check_dependencies, check_version
from llamafactory.extras.packages import is_transformers_version_greater_than

check_dependencies()
check_version("sglang>=0.4.5", mandatory=True)  # hparams/parser.py, infer_backend: sglang (sglang-kt)
print(
    json.dumps(
        {
            "check_dependencies": "ok",
            "check_version('sglang>=0.4.5')": "ok",
            "transformers": transformers.__version__,
            "xgrammar": xgrammar.__name__,
            "is_transformers_version_greater_than('5.0.0')": is_transformers_version_greater_than("5.0.0"),
        }
    )
)
