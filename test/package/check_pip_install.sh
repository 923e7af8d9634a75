#!/usr/bin/env bash
# `pip install .` of the Python package, then its pytest suite against what pip installed (not
# the build directory, not the source tree): what a user of the package gets.
#
# Into a scratch venv that sees this interpreter's packages, with --no-build-isolation, so that
# meson-python, Meson and nanobind are the ones .ci/setup installed and the test needs no network.
# A user's plain `pip install .` fetches the same three from PyPI into an isolated build
# environment instead (pyproject.toml's build-system requires); the build itself is the same.
set -euo pipefail
src=$1 python=$2
# Skipped (77) where this interpreter cannot do it: no meson-python to build with, or no
# ensurepip for the venv (a machine with nanobind only still runs the pytest suite on build/).
for module in mesonpy ensurepip; do
  if ! "$python" -c "import $module" >/dev/null 2>&1; then
    echo "skipped: $python cannot import $module (bash .ci/setup installs it)"
    exit 77
  fi
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== venv at $work/venv (system site packages: pytest, numpy, meson-python, nanobind)"
"$python" -m venv --system-site-packages "$work/venv"
echo "== pip install $src"
PATH=/usr/local/cuda/bin:$PATH "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps "$src"
cd "$work"  # not the source tree, whose python/cunvme has no extension
where=$("$work/venv/bin/python" -c 'import cunvme, os; print(os.path.dirname(cunvme.__file__))')
case $where in
  "$work"/venv/*) echo "== cunvme imported from $where" ;;
  *) echo "cunvme was imported from $where, not from the venv pip installed into" >&2; exit 1 ;;
esac
echo "== pytest $src/python/tests"
PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" -m pytest -p no:cacheprovider -q -rs "$src/python/tests"
