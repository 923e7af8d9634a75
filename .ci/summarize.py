"""Summarise meson test logs: prints "N passed, N failed, N skipped" and exits non-zero on
any failure or when no test ran. Takes one or more testlog.json paths."""
import json
import sys

passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        with open(path, encoding="utf-8") as log:
            for line in log:
                if not line.strip():
                    continue
                result = json.loads(line)["result"]
                if result in ("OK", "EXPECTEDFAIL"):
                    passed += 1
                elif result == "SKIP":
                    skipped += 1
                else:  # FAIL, UNEXPECTEDPASS, TIMEOUT, ERROR, INTERRUPT
                    failed += 1
    except OSError as error:
        print(f"summarize: cannot read {path}: {error.strerror}", file=sys.stderr)
        failed += 1

print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(0 if failed == 0 and passed > 0 else 1)
