#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): the zoo built for backend=cuda, both loaders, outputs against the CPU build's.
#   scripts/gpu_check.sh [--wheels DIR | --no-install] [gpu_check.py's options: --cpu, --gpu NAME, --deviceless ART,
#                        --out DIR]
# On a machine that has jax (with its CUDA plugin) and its own PyTorch, it installs only the project, without its
# dependencies (pip install --no-deps -e .), then those of the project's pure-Python dependencies the machine lacks:
# from --wheels DIR where the machine has no package index (pip download them beside the project beforehand), else
# from the index. jax, jaxlib and torch are never installed or replaced here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(scripts/find-python)}
wheels=()
install=1
if [ "${1:-}" = "--wheels" ]; then
  wheels=(--no-index --find-links "$2")
  shift 2
elif [ "${1:-}" = "--no-install" ]; then  # the project is installed already (CI: its venv is in use by other tests)
  install=0
  shift
fi
"$PY" -c 'import jax, jaxlib' 2> /dev/null || { echo "gpu_check: this Python ($PY) has no jax; install jax[cuda13] first" >&2; exit 2; }
[ "$install" = 1 ] || exec "$PY" scripts/gpu_check.py "$@"
"$PY" -m pip install -q --no-deps -e . > /dev/null
# the project's dependencies but jax and jaxlib, as pyproject.toml pins them; only the missing ones are installed
missing=$("$PY" - <<'PYEOF'
import importlib.metadata as md, re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
out = []
for dep in deps:
    name = re.split(r"[<>=!\[ ;]", dep, maxsplit=1)[0]
    if name in ("jax", "jaxlib"):
        continue
    try:
        md.version(name)
    except md.PackageNotFoundError:
        out.append(dep)
print("\n".join(out))
PYEOF
)
if [ -n "$missing" ]; then
  echo "gpu_check: installing what this machine lacks: $(echo $missing | tr '\n' ' ')"
  mapfile -t deps <<< "$missing"
  "$PY" -m pip install -q "${wheels[@]}" "${deps[@]}"
fi
exec "$PY" scripts/gpu_check.py "$@"
