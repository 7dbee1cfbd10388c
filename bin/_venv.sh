# Sourced by bin/demo and bin/test: makes .venv (once, and again when setup.cfg changes) and puts it first on PATH.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.setup.cfg.sha"
want="$(sha256sum "$ROOT/setup.cfg" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "setting up $VENV (first run: downloads TensorFlow and friends, a few minutes)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # The hf extra's torch: the CPU build where one lies on this machine's disk (pip's configured find-links;
  # no index asked), which the extra's range accepts; elsewhere pip picks one for the extra (on Linux a CUDA
  # build of several GB).
  "$VENV/bin/python" -m pip install -q --no-index --no-deps "torch==2.13.0" 2>/dev/null || true
  "$VENV/bin/python" -m pip install -q -e "$ROOT[tf-cpu,test,beam,prepare,dask,hf,words,plot]"
  echo "$want" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
