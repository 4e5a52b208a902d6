#!/usr/bin/env bash
# Build, on a (CPU) machine with network, the wheelhouse a GPU machine needs to run tx
# (docs/operations.md#gpu-checks). That machine has no network and its own Python (3.12, torch 2.11.0+cu130
# and many packages, listed in IMAGE below), and only files that travel with the checkout reach it. So this
# resolves tx's runtime dependencies (pyproject.toml, torch left out) plus what the GPU tests need beyond them
# (tinker, from the dev extra) for that Python, leaves out what the image already has at a version that meets
# what is asked of it, and downloads the rest as wheels into DEST (default .whl/ in the repo root, ignored).
# It never carries torch or anything CUDA (torch*, triton, nvidia-*, cuda-*): the resolution sees a stub torch
# at the image's version instead.
#
#   scripts/gpu/prepare.sh [--python 3.12] [--dest DIR] [--site DIR] [--budget-mib 48]
#
#   --python      the GPU machine's Python (major.minor, default 3.12): wheels are chosen for it
#   --dest        the wheelhouse (default .whl in the repo root); its *.whl are replaced
#   --site        where the install line puts the wheels on the GPU machine (default /tmp/site)
#   --budget-mib  fail above this many MiB of wheels (default 48: the call carries 64 MiB, checkout included)
#
# It writes DEST/install.sh, the one line a GPU run starts with (from the repo root; scripts/gpu_checks.sh
# sources it): pip installs the wheels into --site, with no index and no dependencies, and puts --site and the
# checkout on PYTHONPATH. DEST/image.txt lists what was left to the image (the resolved version, and the
# image's where IMAGE knows it): tests/test_gpu_prepare.py installs those into its stand-in for the image.
# The resolution is evaluated with the markers of the Python that runs pip: set PYTHON to one of the target's
# version (python3.12 is used when on PATH). Needs the network (PyPI). ~1 min; the wheelhouse ~35 MiB.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
version=3.12
dest=$root/.whl
site=/tmp/site
budget_mib=48
glibc_max=35  # wheels up to manylinux_2_35 (the GPU image is newer; this machine's CI has 2.36)

while (($#)); do
    case $1 in
        --python) version=$2; shift 2 ;;
        --dest) dest=$2; shift 2 ;;
        --site) site=$2; shift 2 ;;
        --budget-mib) budget_mib=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "prepare.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ ! $version =~ ^3\.[0-9]+$ ]]; then
    echo "prepare.sh: --python wants major.minor, e.g. 3.12 (got $version)" >&2
    exit 2
fi

# What the GPU image's python3 already has (its package list as read there on 2026-11-17): name==version where
# a version was read there, a bare name where none was. A package there is left to it when its version meets
# what tx and the carried packages ask of it (what the image's own packages ask is met there already); a bare
# one only when all they ask is a lower bound (>=, >, !=). Otherwise the resolved version is carried.
IMAGE="
torch==2.11.0 triton==3.6.0 torchaudio==2.11.0 torchvision==0.26.0 transformers==5.17.0 accelerate==1.15.0
huggingface-hub==1.33.0 numpy==2.5.2 safetensors==0.8.0 tokenizers==0.23.2 sentencepiece==0.2.2
tiktoken==0.14.0 jax==0.11.2 jaxlib==0.11.2 onnx==1.23.1 onnxruntime==1.30.0 sentence-transformers==6.0.1
torchmetrics==1.9.0
absl-py aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py
hf-xet httpcore httpx humanize hypothesis idna imageio iniconfig interface-meta jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions
nanobind narwhals networkx ninja numba numba-cuda numpyro nvidia-ml-py opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu scikit-build-core scikit-image scikit-learn scipy
seaborn setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile timm toolz torch-geometric torchdiffeq tqdm
treescope typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp
"
NEVER='^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)$'  # the image's own CUDA stack: never carried
DEV_NEEDS="tinker"  # the dev extra's packages the GPU tests import (pytest, pytest-timeout: in the image)
# Carried whatever version the image has. protobuf: tx's generated code (tx/api/wire/*_pb2.py) refuses a
# runtime older than the protoc that wrote it, newer than pyproject.toml's bound; step 1 adds that as a need.
ALWAYS="protobuf"

PY=${PYTHON:-}
if [[ -z $PY ]]; then
    PY=python3
    if command -v "python$version" >/dev/null && "python$version" -c '' 2>/dev/null; then
        PY=python$version
    fi
fi
running=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [[ $running != "$version" ]]; then
    echo "prepare.sh: note: pip runs on Python $running, so environment markers are read for $running, not" \
         "$version (set PYTHON to a python$version for exact ones)" >&2
fi

platforms=()
for ((n = glibc_max; n >= 17; n--)); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
target=(--only-binary=:all: --python-version "$version" --implementation cp "${platforms[@]}")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

# 1. The requirements (pyproject.toml, less torch, plus DEV_NEEDS), the image's versions as constraints, and a
#    stub torch wheel at the image's version (the resolution then pulls no CUDA wheel, none of torch's needs).
"$PY" - "$root/pyproject.toml" "$work" "$IMAGE" "$NEVER" "$DEV_NEEDS" <<'EOF'
import re, sys, zipfile
from pathlib import Path
try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib
try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

pyproject, work, image, never, dev_needs = sys.argv[1:]
work = Path(work)
project = tomllib.loads(Path(pyproject).read_text())["project"]
reqs = [Requirement(r) for r in project["dependencies"]]
wanted = {canonicalize_name(n) for n in dev_needs.split()}
reqs += [Requirement(r) for r in project["optional-dependencies"]["dev"]
         if canonicalize_name(Requirement(r).name) in wanted]
reqs = [r for r in reqs if not re.match(never, canonicalize_name(r.name))]
(work / "reqs.txt").write_text("".join(f"{r}\n" for r in reqs))
# The protobuf runtime that tx's generated code accepts: at least its gencode's version.
gencode = [tuple(map(int, m)) for pb2 in (Path(pyproject).parent / "tx").rglob("*_pb2.py") for m in
           re.findall(r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", pb2.read_text())]
(work / "extra.txt").write_text("protobuf>=%d.%d.%d\n" % max(gencode) if gencode else "")
top = {canonicalize_name(r.name): r for r in reqs}
pins = dict(item.split("==") for item in image.split() if "==" in item)
torch = pins.pop("torch")
stub = f"{torch}+image"
# A pin that a top-level requirement rules out (transformers 5.17 against >=5.19) is no constraint.
kept = {name: v for name, v in pins.items() if not re.match(never, name)
        and (name not in top or top[name].specifier.contains(v, prereleases=True))}
(work / "pinned.txt").write_text(f"torch=={stub}\n" + "".join(f"{n}=={v}\n" for n, v in sorted(kept.items())))
(work / "unpinned.txt").write_text(f"torch=={stub}\n")
(work / "stub").mkdir()
dist = f"torch-{stub}.dist-info"
with zipfile.ZipFile(work / "stub" / f"torch-{stub}-py3-none-any.whl", "w") as whl:
    whl.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {stub}\n")
    whl.writestr(f"{dist}/WHEEL",
                 "Wheel-Version: 1.0\nGenerator: prepare.sh\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    whl.writestr(f"{dist}/RECORD", f"{dist}/METADATA,,\n{dist}/WHEEL,,\n{dist}/RECORD,,\n")
EOF

# 2. Resolve for the target: with the image's versions as constraints (so what those need, not what the newest
#    releases need, is resolved). A pin that pip names in a conflict ("Cannot install numpy>=1.26 because...",
#    e.g. numpy 2.5.2 has no wheel for Python 3.11) is dropped and the rest tried again; failing that, none.
resolve() {
    rm -f "$work/report.json"
    "$PY" -m pip install --dry-run --ignore-installed --quiet --target "$work/none" \
        --report "$work/report.json" "${target[@]}" --find-links "$work/stub" \
        -r "$work/reqs.txt" -r "$work/extra.txt" \
        -c "$work/$1.txt" >"$work/resolve.log" 2>&1 || true
    [[ -s $work/report.json ]]
}
unpin() {  # drop the pins that the last resolution's conflict names; fail if it names none
    "$PY" - "$work/pinned.txt" "$work/resolve.log" <<'EOF'
import re, sys
from pathlib import Path
pins, log = Path(sys.argv[1]), Path(sys.argv[2]).read_text()
named = {re.split(r"[\[<>=!~; ]", part.strip())[0].lower().replace("_", "-")
         for found in re.findall(r"Cannot install (.*?) because", log)
         for part in re.split(r",| and ", found)}
lines = pins.read_text().splitlines()
kept = [line for line in lines if line.startswith("torch==") or line.split("==")[0] not in named]
pins.write_text("".join(f"{line}\n" for line in kept))
print(" ".join(line for line in lines if line not in kept))
sys.exit(0 if len(kept) < len(lines) else 1)
EOF
}
start=$SECONDS
echo "prepare.sh: resolving for Python $version (linux x86_64, manylinux up to 2_$glibc_max)"
until resolve pinned; do
    if dropped=$(unpin); then
        echo "prepare.sh: the image's $dropped cannot be kept: resolving again without" >&2
        continue
    fi
    grep -v 'is ignored: it is neither a file nor a directory' "$work/resolve.log" >&2 || true
    echo "prepare.sh: the image's versions cannot be kept: resolving without them" >&2
    resolve unpinned || {
        grep -v 'is ignored: it is neither a file nor a directory' "$work/resolve.log" >&2 || true
        echo "prepare.sh: the resolution failed" >&2
        exit 1
    }
    break
done
echo "prepare.sh: resolved in $((SECONDS - start)) s"

# 3. Decide: what the image has at a version that every requirement on it accepts stays; the rest is carried.
"$PY" - "$work" "$dest" "$IMAGE" "$NEVER" "$ALWAYS" "$version" <<'EOF'
import json, re, sys
from collections import defaultdict
from pathlib import Path
try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

work, dest, image, never, always, version = sys.argv[1:]
work, dest = Path(work), Path(dest)
env = {"implementation_name": "cpython", "implementation_version": f"{version}.0", "os_name": "posix",
       "platform_machine": "x86_64", "platform_release": "", "platform_system": "Linux",
       "platform_version": "", "python_full_version": f"{version}.0",
       "platform_python_implementation": "CPython", "python_version": version, "sys_platform": "linux"}
known = {}
for item in image.split():
    name, _, v = item.partition("==")
    known[canonicalize_name(name)] = v or None
report = json.loads((work / "report.json").read_text())
resolved = {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in report["install"]}
top = [Requirement(line) for line in (work / "reqs.txt").read_text().splitlines()]
extra = [Requirement(line) for line in (work / "extra.txt").read_text().splitlines()]
always = {canonicalize_name(n) for n in always.split()}

extras = defaultdict(set)  # the extras asked of each package, by anyone
def applies(req, extras_of_owner):
    return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in {"", *extras_of_owner})
def edges():
    yield from (("pyproject.toml", r) for r in top)
    yield from (("prepare.sh", r) for r in extra)
    for name, meta in resolved.items():
        for line in meta.get("requires_dist") or []:
            req = Requirement(line)
            if applies(req, extras[name]):
                yield f"{meta['name']} {meta['version']}", req
for _ in range(10):  # the extras reach a fixpoint in a round or two
    before = sum(map(len, extras.values()))
    for _, req in list(edges()):
        extras[canonicalize_name(req.name)] |= set(req.extras)
    if sum(map(len, extras.values())) == before:
        break
def trusted(name, specs):
    """Whether the image's own version of `name` meets `specs` (the project's, the carried packages'), and why
    not."""
    if name in always:
        return False, "carried whatever the image has"
    if known[name] is not None:
        bad = [f"{o}: {s}" for o, s in specs if not s.contains(known[name], prereleases=True)]
        return not bad, f"the image has {known[name]}; " + "; ".join(bad)
    bad = [f"{o}: {s}" for o, s in specs if any(sp.operator not in (">=", ">", "!=") for sp in s)]
    return not bad, "the image's version is not read; " + "; ".join(bad)

# What a package left to the image needs is met there already (the image's own install resolved it), so only
# the project's requirements and the carried packages' count; carrying one more adds some: to a fixpoint.
project = {"pyproject.toml", "prepare.sh"}
carried = {name for name in resolved if name not in known and not re.match(never, name)}
while True:
    counted = defaultdict(list)
    for owner, req in edges():
        if owner in project or canonicalize_name(owner.split()[0]) in carried:
            counted[canonicalize_name(req.name)].append((owner, req.specifier))
    more = {name for name in resolved if name in known and not re.match(never, name)
            and not trusted(name, counted[name])[0]}
    if more <= carried:
        break
    carried |= more
carry, left = [], []
for name, meta in sorted(resolved.items()):
    v = meta["version"]
    if re.match(never, name):
        if Version(v).local != "image":
            print(f"prepare.sh: warning: the resolution asked for {name} {v}: not carried (the image's own)")
    elif name not in known:
        carry.append((meta["name"], v, "not in the image"))
    elif name in carried:
        carry.append((meta["name"], v, trusted(name, counted[name])[1]))
    else:
        left.append(f"{meta['name']}=={v}  # the image: {known[name] or 'a version not read'}")
(work / "carry.txt").write_text("".join(f"{n}=={v}\n" for n, v, _ in carry))
(dest / "image.txt").write_text(
    "# Left to the GPU image by scripts/gpu/prepare.sh (Python %s): the resolved version, then the image's.\n"
    % version + "".join(f"{line}\n" for line in left))
print(f"prepare.sh: {len(carry)} to carry, {len(left)} left to the image (DEST/image.txt)")
for n, v, why in carry:
    print(f"  carry {n}=={v}: {why}")
EOF

# 4. Download them (no dependencies: the resolution named every one), one version of each.
rm -f "$dest"/*.whl
start=$SECONDS
"$PY" -m pip download --no-deps --quiet "${target[@]}" -d "$dest" -r "$work/carry.txt" 2>&1 \
    | grep -v 'is ignored: it is neither a file nor a directory' || true
echo "prepare.sh: downloaded in $((SECONDS - start)) s"
"$PY" - "$dest" "$work/carry.txt" "$budget_mib" <<'EOF'
import sys, zipfile
from collections import Counter
from pathlib import Path
try:
    from packaging.utils import canonicalize_name
except ImportError:
    from pip._vendor.packaging.utils import canonicalize_name

dest, carry, budget = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
wheels = sorted(dest.glob("*.whl"))
names = Counter(canonicalize_name(w.name.split("-")[0]) for w in wheels)
wanted = {canonicalize_name(line.split("==")[0]) for line in carry.read_text().split()}
if twice := [n for n, k in names.items() if k > 1]:
    sys.exit(f"prepare.sh: more than one version of {', '.join(twice)} in {dest}")
if missing := sorted(wanted - set(names)):
    sys.exit(f"prepare.sh: no wheel for {', '.join(missing)}")
for w in wheels:
    pth = [n for n in zipfile.ZipFile(w).namelist() if "/" not in n and n.endswith(".pth")]
    if pth:
        print(f"prepare.sh: warning: {w.name} has {pth}: PYTHONPATH does not read .pth files")
total = sum(w.stat().st_size for w in wheels)
for w in sorted(wheels, key=lambda w: -w.stat().st_size):
    print(f"  {w.stat().st_size / 2**20:6.2f} MiB  {w.name}")
print(f"prepare.sh: {len(wheels)} wheels, {total / 2**20:.1f} MiB (budget {budget:g} MiB)")
if total > budget * 2**20:
    sys.exit(f"prepare.sh: the wheelhouse is over its budget of {budget:g} MiB")
EOF

# 5. The install line, from the repo root: the wheels by a path relative to it where they lie inside it.
case $dest/ in
    "$root"/*) wheels=${dest#"$root"/} ;;
    *) wheels=$dest ;;
esac
site_q=$(printf %q "$site")
line="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site_q"
line+=" $(printf %q "$wheels")/*.whl && export PYTHONPATH=$site_q:\$PWD\${PYTHONPATH:+:\$PYTHONPATH}"
printf '# Written by scripts/gpu/prepare.sh for Python %s: source it from the repo root.\n%s\n' \
    "$version" "$line" >"$dest/install.sh"
echo "prepare.sh: wrote $dest/install.sh:"
echo "$line"
