#!/usr/bin/env bash
# Checks C++ headers against the repository's .clang-format with clang-format 14 (Debian 12's),
# the version the style was tuned with: others format some constructs (requires-clauses,
# braced lists) differently, so with another version the check is skipped rather than wrong.
#
#   .ci/format_check.sh               the headers listed in .ci/format_files (the CI check)
#   .ci/format_check.sh --all         every header under include/ (what a reformat would touch)
#   .ci/format_check.sh --candidates  headers under include/ that are clean but not listed yet
#
# Exit 0: formatted; 1: not (clang-format names each place); 2: usage or a stale list;
# 77: no clang-format 14 here (Meson counts it as skipped). CLANG_FORMAT names the binary.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-listed}
case "$mode" in listed | --all | --candidates) ;; *) sed -n '2,11p' "$0" >&2; exit 2 ;; esac

cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
  for candidate in clang-format-14 clang-format; do
    if command -v "$candidate" >/dev/null 2>&1; then cf=$candidate; break; fi
  done
fi
if [ -z "$cf" ] || ! command -v "$cf" >/dev/null 2>&1; then
  echo "format_check: no clang-format found (Debian: apt-get install clang-format): skipped"
  exit 77
fi
major=$("$cf" --version | sed -n 's/.*clang-format version \([0-9]*\).*/\1/p')
if [ "$major" != 14 ]; then
  echo "format_check: $cf is version ${major:-unknown}, the style is checked with 14: skipped"
  exit 77
fi

all_headers() { find include -name '*.cuh' | LC_ALL=C sort; }
listed_headers() { grep -v -e '^#' -e '^$' .ci/format_files; }

case "$mode" in
  listed)
    mapfile -t files < <(listed_headers)
    for f in "${files[@]}"; do
      [ -f "$f" ] || { echo "format_check: $f is listed in .ci/format_files but does not exist"; exit 2; }
    done
    ;;
  --all) mapfile -t files < <(all_headers) ;;
  --candidates)
    comm -23 <(all_headers) <(listed_headers | LC_ALL=C sort) | while read -r f; do
      if "$cf" --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then echo "$f"; fi
    done
    exit 0
    ;;
esac

if "$cf" --style=file --dry-run --Werror "${files[@]}"; then
  echo "format_check: ${#files[@]} header(s) formatted as .clang-format says"
else
  echo "format_check: run $cf -i --style=file on the files named above"
  exit 1
fi
