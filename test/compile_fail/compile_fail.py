#!/usr/bin/env python3
"""A compile-fail test, as libcu++'s *.fail.cpp: a source that must not compile.

  compile_fail.py SOURCE -- COMPILER [ARGS...]

SOURCE's `// expect-error: TEXT` lines name what the diagnostic must mention (the concept
and the missing member), so the test cannot pass for another reason (a missing include, a
typo). And SOURCE compiled with -DCOMPILE_FAIL_CONTROL (which supplies the missing member)
must compile: the one member is all that is wrong.
"""

import subprocess
import sys


def compile_source(command, source, *extra):
    run = subprocess.run([*command, *extra, source], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return run.returncode, run.stdout


def main(argv):
    if len(argv) < 4 or argv[2] != '--':
        print(__doc__, file=sys.stderr)
        return 2
    source, command = argv[1], argv[3:]
    with open(source, encoding='utf-8') as f:
        expected = [line.split('expect-error:', 1)[1].strip() for line in f if line.startswith('// expect-error:')]
    if not expected:
        print(f'{source}: no "// expect-error:" line: say what the diagnostic must mention')
        return 1

    code, output = compile_source(command, source, '-DCOMPILE_FAIL_CONTROL')
    if code != 0:
        print(output)
        print(f'{source}: the control (-DCOMPILE_FAIL_CONTROL) does not compile either: the test would fail for another reason')
        return 1

    code, output = compile_source(command, source)
    if code == 0:
        print(f'{source}: compiled, but must not')
        return 1
    missing = [text for text in expected if text not in output]
    if missing:
        print(output)
        print(f'{source}: failed to compile, but the diagnostic does not mention {missing}')
        return 1
    print(f'{source}: refused as expected (diagnostic mentions {expected})')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
