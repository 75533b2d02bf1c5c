#!/usr/bin/env python3
"""The checks of tests/lint.sh over one compilation database: clang's
-Wthread-safety and clang-tidy (.clang-tidy), on every source under
server/, worker/, common/, deploy/ and python/. Prints each finding; exits 1 on any."""
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ("server/", "worker/", "common/", "deploy/", "python/")


def sources(build):
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    out = []
    for e in entries:
        rel = os.path.relpath(e["file"], ROOT)
        if rel.startswith(CHECKED) and rel.endswith(".cc"):
            out.append((rel, e))
    return sorted(out, key=lambda x: x[0])


def clang_args(entry):
    """The entry's compile flags for clang's front end: includes, defines, standard."""
    args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
    # -isystem takes its path as the next argument.
    fixed, i = [], 0
    full = args[1:]
    while i < len(full):
        if full[i] == "-isystem":
            fixed += [full[i], full[i + 1]]
            i += 2
            continue
        if full[i].startswith(("-I", "-D", "-std=")) or full[i] == "-pthread":
            fixed.append(full[i])
        i += 1
    return fixed


def thread_safety(item):
    rel, entry = item
    cmd = ["clang++", "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"] + clang_args(entry) + [rel]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [l for l in r.stderr.splitlines() if "-Wthread-safety" in l]
    if r.returncode != 0 and not lines:
        lines = [f"{rel}: clang could not compile it:"] + r.stderr.splitlines()[:10]
    return lines


def tidy(build, rel):
    r = subprocess.run(["clang-tidy", "-p", build, "--quiet", rel], cwd=ROOT, capture_output=True, text=True)
    return [l for l in r.stdout.splitlines() if ": warning: " in l or ": error: " in l]


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build"))
    files = sources(build)
    failures = []
    jobs = max(1, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for lines in pool.map(thread_safety, files):
            failures += lines
        for lines in pool.map(lambda f: tidy(build, f[0]), files):
            failures += lines
    for line in sorted(set(failures)):
        print(line)
    print(f"lint: {len(files)} files (clang -Wthread-safety, clang-tidy), {len(set(failures))} findings")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
