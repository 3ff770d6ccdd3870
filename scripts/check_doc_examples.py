#!/usr/bin/env python3
"""Checks that the code in the documentation is code that CI compiles and runs.

In README.md, docs/C-QUICKSTART.md and python/README.md, every fenced block in C,
C++, Rust or Python must be directly preceded by one of:

    <!-- example: PATH -->   the block is exactly the file PATH (a complete program
                             that CI builds and runs: ctest, cargo test, the Python
                             examples step)
    <!-- excerpt: PATH -->   every line of the block occurs in PATH, in order
                             (indentation aside; a line "..." skips any lines)

so no documented snippet can drift from code that is tested.

Some documented examples also have a size budget (BUDGETS: issue 29, the README's C++
example in at most 30 lines of user code). User code is what is left once comments
(`//` to the end of the line, `/* ... */`), blank lines and `#include` lines are taken
out; a line that holds any code counts once. `--count PATH` prints that number for a
file.

Exit 1 with a list of what differs or is over budget. Run from anywhere: paths are
relative to the repository root.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "docs/C-QUICKSTART.md", "python/README.md"]
CHECKED = {"c", "cpp", "c++", "rust", "python", "py"}
MARK = re.compile(r"^<!-- (example|excerpt): (\S+) -->$")
# Lines of user code (user_code_lines) allowed in a documented example.
BUDGETS = {"examples/quickstart.cpp": 30}
CODE = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)
FENCE = re.compile(r"^```(\S*)\s*$")


def blocks(text: str):
    """(line number, language, body lines, marker or None) of every fenced block."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1).lower(), i
        j = i + 1
        while j < len(lines) and lines[j] != "```":
            j += 1
        prev = start - 1
        while prev >= 0 and lines[prev].strip() == "":
            prev -= 1
        mark = MARK.match(lines[prev]) if prev >= 0 and start - prev <= 2 else None
        yield start + 1, lang, lines[start + 1:j], mark
        i = j + 1


def user_code_lines(text: str) -> list:
    """The lines of C/C++ `text` that hold user code: comments removed (string and
    character literals are kept whole, so a "//" inside one is code), then blank lines
    and `#include` lines dropped."""
    def blank_comment(m: "re.Match[str]") -> str:
        t = m.group(0)
        if t.startswith("//"):
            return ""
        if t.startswith("/*"):
            return "\n" * t.count("\n")  # keep the line structure
        return t
    stripped = CODE.sub(blank_comment, text)
    return [line for line in stripped.split("\n") if line.strip() and not line.strip().startswith("#include")]


def excerpt_ok(body: list, source: list) -> str:
    """'' when every line of `body` occurs in `source` in order, else the first miss."""
    k = 0
    for line in body:
        want = line.strip()
        if want in ("", "...", "// ...", "# ...", "/* ... */"):
            continue
        while k < len(source) and source[k].strip() != want:
            k += 1
        if k == len(source):
            return line
        k += 1
    return ""


def main() -> int:
    errors = []
    checked = 0
    for doc in DOCS:
        path = ROOT / doc
        for line, lang, body, mark in blocks(path.read_text(encoding="utf-8")):
            if lang not in CHECKED:
                continue
            where = f"{doc}:{line} ({lang})"
            if mark is None:
                errors.append(f"{where}: no <!-- example: PATH --> or <!-- excerpt: PATH --> line above the block")
                continue
            kind, target = mark.group(1), ROOT / mark.group(2)
            if not target.is_file():
                errors.append(f"{where}: {kind} file {mark.group(2)} does not exist")
                continue
            source = target.read_text(encoding="utf-8").rstrip("\n").split("\n")
            if kind == "example":
                if body != source:
                    diff = next((n for n, (a, b) in enumerate(zip(body, source)) if a != b), min(len(body), len(source)))
                    errors.append(f"{where}: differs from {mark.group(2)} at its line {diff + 1}; "
                                  f"copy the file into the block (or the block into the file)")
            else:
                miss = excerpt_ok(body, source)
                if miss:
                    errors.append(f"{where}: this line is not in {mark.group(2)} (in order): {miss.strip()!r}")
            checked += 1
    for path, budget in BUDGETS.items():
        n = len(user_code_lines((ROOT / path).read_text(encoding="utf-8")))
        print(f"{path}: {n} lines of user code (budget {budget})")
        if n > budget:
            errors.append(f"{path}: {n} lines of user code, over its budget of {budget} "
                          f"(comments, blank lines and #include lines do not count)")
    for e in errors:
        print(e, file=sys.stderr)
    print(f"{checked} documented code blocks checked against tested files, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--count":
        print(len(user_code_lines(Path(sys.argv[2]).read_text(encoding="utf-8"))))
        sys.exit(0)
    sys.exit(main())
