#!/usr/bin/env bash
# Install tinker-cookbook 0.6.1 into the CURRENT Python environment (activate the venv first),
# the way docs/cookbook.md#installing-the-cookbook says works offline-ish:
#   - `pip install tinker-cookbook==0.6.1` fails: it declares tml-renderers>=0.4.1, which the index
#     lacks (the newest there is 0.2.1). So: the wheel with --no-deps, then its other dependencies by
#     hand, tml-renderers at the newest reachable release (0.2.1 renders every Inkling call the audio
#     recipes make: docs/cookbook.md#audio-recipes).
#   - tx's own pins must not move: transformers and torch are passed as constraints at the versions
#     already installed (CI's: transformers 5.23.x, torch 2.13.0).
#   - the math-rl extra (sympy, pylatexenc, math-verify) is included: math_rl/train.py imports
#     math_grading, which needs sympy and pylatexenc at import time.
#   - the audio extra (jiwer, soundfile) is included, and imageio-ffmpeg: an ffmpeg binary for the
#     emotion recipe's prepare_data (it transcodes with `ffmpeg`; the tests put this one on PATH).
# Idempotent: returns quickly when everything is already there. Fails loudly on any error.
set -euo pipefail

COOKBOOK_VERSION="0.6.1"
PY="${PYTHON:-python}"

if [[ -z "${VIRTUAL_ENV:-}" && -z "${TX_ALLOW_SYSTEM_INSTALL:-}" ]]; then
    echo "install_cookbook.sh: no virtualenv active (set TX_ALLOW_SYSTEM_INSTALL=1 to install anyway)" >&2
    exit 1
fi

# The cookbook's dependencies (tml-renderers at what the index has), plus the math-rl and audio extras.
DEPS=(
    "tinker==0.38.0"
    "aiohttp"
    "anyio"
    "blobfile"
    "chz>=0.4"
    "cloudpickle"
    "datasets"
    "huggingface-hub"
    "numpy"
    "pillow"
    "pydantic"
    "pyrage"
    "rich"
    "safetensors"
    "termcolor"
    "tiktoken"
    "tqdm"
    "sympy"
    "pylatexenc"
    "math-verify"
    "tml-renderers>=0.2.1"
    "jiwer>=3.0.0"
    "soundfile>=0.12.0"
    "imageio-ffmpeg"
)

# Everything present at the right version? Then there is nothing to do.
if "$PY" - "$COOKBOOK_VERSION" <<'PYEOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("tinker-cookbook") == sys.argv[1]
for mod in ["tinker_cookbook", "tinker", "aiohttp", "anyio", "blobfile", "chz", "cloudpickle", "datasets",
            "huggingface_hub", "numpy", "PIL", "pydantic", "pyrage", "rich", "safetensors", "termcolor",
            "tiktoken", "tqdm", "sympy", "pylatexenc", "math_verify", "torch", "transformers",
            "tml_renderers", "jiwer", "soundfile", "imageio_ffmpeg"]:
    __import__(mod)
import tinker_cookbook.recipes.chat_sl.train  # noqa: F401
import tinker_cookbook.recipes.math_rl.train  # noqa: F401
import tinker_cookbook.recipes.audio.asr.sl_train  # noqa: F401
PYEOF
then
    echo "tinker-cookbook ${COOKBOOK_VERSION} already installed"
    exit 0
fi

# Pin what tx depends on to what is installed now, so the resolver cannot move them.
TORCH_VERSION="$("$PY" -c 'from importlib.metadata import version; print(version("torch").split("+")[0])')"
TRANSFORMERS_VERSION="$("$PY" -c 'from importlib.metadata import version; print(version("transformers"))')"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
cat >"$CONSTRAINTS" <<CEOF
torch==${TORCH_VERSION}
transformers==${TRANSFORMERS_VERSION}
CEOF

echo "installing tinker-cookbook ${COOKBOOK_VERSION} (torch==${TORCH_VERSION}, transformers==${TRANSFORMERS_VERSION} held)"
PIPLOG="$(mktemp)"
trap 'rm -f "$CONSTRAINTS" "$PIPLOG"' EXIT
pip_quiet() {
    # pip's own noise (ignored index locations; the expected missing tml-renderers) is hidden unless it fails.
    if ! "$PY" -m pip install --quiet --disable-pip-version-check "$@" >"$PIPLOG" 2>&1; then
        cat "$PIPLOG" >&2
        echo "install_cookbook.sh: pip install $* FAILED" >&2
        exit 1
    fi
    grep -vE "is ignored: it is neither a file nor a directory|dependency resolver does not currently|tml-renderers|tinker-cookbook 0.6.1 requires" \
        "$PIPLOG" >&2 || true
}
pip_quiet --no-deps "tinker-cookbook==${COOKBOOK_VERSION}"
pip_quiet -c "$CONSTRAINTS" "${DEPS[@]}"

# Check the result: the held versions did not move, and the recipes import.
"$PY" - "$TORCH_VERSION" "$TRANSFORMERS_VERSION" "$COOKBOOK_VERSION" <<'PYEOF'
import sys
from importlib.metadata import version
torch_v, tf_v, cb_v = sys.argv[1:]
assert version("torch").split("+")[0] == torch_v, f"torch moved to {version('torch')}"
assert version("transformers") == tf_v, f"transformers moved to {version('transformers')}"
assert version("tinker-cookbook") == cb_v, version("tinker-cookbook")
import tinker_cookbook.recipes.chat_sl.train  # noqa: F401
import tinker_cookbook.recipes.math_rl.train  # noqa: F401
import tinker_cookbook.recipes.vlm_classifier.train  # noqa: F401
import tinker_cookbook.recipes.audio.asr.sl_train  # noqa: F401
import tinker_cookbook.recipes.audio.emotion.rl_train  # noqa: F401
import tinker_cookbook.recipes.audio.medical_asr.train  # noqa: F401
import jiwer, soundfile, tml_renderers.tinker  # noqa: F401,E401
print(f"tinker-cookbook {cb_v} installed (torch {version('torch')}, transformers {tf_v})")
PYEOF
