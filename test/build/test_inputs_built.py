#!/usr/bin/env python3
"""Every test must pass after a plain build (`ninja -C build`, then `meson test --no-rebuild`).

A custom_target is not built by default; a test that names one only through `depends:` or its
arguments gets its input from `meson test`'s own rebuild, and fails under --no-rebuild (the
file_to_gpu example once did). This reads the build directory's introspection files and names
every test whose command or dependencies come from a target that a plain build leaves out.
"""
import json
import sys
from pathlib import Path


def main() -> int:
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} BUILD_DIR", file=sys.stderr)
        return 2
    info = Path(sys.argv[1]) / "meson-info"
    targets = json.loads((info / "intro-targets.json").read_text())
    tests = json.loads((info / "intro-tests.json").read_text())
    benchmarks = json.loads((info / "intro-benchmarks.json").read_text())

    by_id = {t["id"]: t for t in targets}
    not_built = {t["id"]: t for t in targets if not t["build_by_default"]}
    outputs = {}
    for t in not_built.values():
        for f in t["filename"]:
            outputs[str(Path(f).resolve())] = t

    problems = []
    for test in tests + benchmarks:
        for dep in test["depends"]:
            if dep in not_built:
                problems.append(f"{test['name']!r} depends on {not_built[dep]['name']!r}, which a plain build leaves out")
            elif dep not in by_id:
                problems.append(f"{test['name']!r} depends on an unknown target {dep!r}")
        for arg in test["cmd"]:
            target = outputs.get(str(Path(arg).resolve())) if arg.startswith("/") else None
            if target is not None:
                problems.append(f"{test['name']!r} runs with {arg} from {target['name']!r}, which a plain build leaves out")
    for p in sorted(set(problems)):
        print(p)
    if problems:
        print(f"{len(set(problems))} test input(s) are built only by `meson test`'s rebuild: give their targets build_by_default: true")
        return 1
    print(f"{len(tests) + len(benchmarks)} tests: every input is built by a plain build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
