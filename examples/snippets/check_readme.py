"""Checks that README.md's first program is examples/first_program.cu word for word: the README
shows a file that CI compiles, so its code cannot drift from the library.

  check_readme.py README.md examples/first_program.cu
"""
import sys


def first_cuda_block(text):
    fence = "```cpp\n"
    start = text.find(fence + "// README.md's first program")
    if start < 0:
        return None
    start += len(fence)
    end = text.find("\n```", start)
    return text[start:end + 1]


def main(argv):
    readme, program = open(argv[1]).read(), open(argv[2]).read()
    block = first_cuda_block(readme)
    if block is None:
        print(f"{argv[1]}: no ```cpp block starting with \"// README.md's first program\"")
        return 1
    if block != program:
        print(f'{argv[1]}: its first program differs from {argv[2]}; copy the file into the README')
        return 1
    print(f'{argv[1]}: the first program is {argv[2]}')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
