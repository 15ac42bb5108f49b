#!/bin/sh
# ctest driver for torch_parity.py: a missing interpreter is treated like a missing torch
# (skip with 77, or fail when CI=true), so the check never silently disappears from CI.
py="$1"
shift
if [ ! -x "$py" ]; then
  echo "torch_parity: python interpreter '$py' not found (configure with -DDESLOC_PYTHON=...)"
  [ "$CI" = "true" ] && exit 1
  exit 77
fi
exec "$py" "$@"
