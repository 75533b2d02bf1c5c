#!/usr/bin/env python3
"""The checks of tests/lint.sh over one compilation database: clang-tidy
(.clang-tidy) with clang's -Wthread-safety, in one parse of every source
under server/, worker/, common/, deploy/ and python/, and of the headers
there that they include. Prints each finding; exits 1 on any."""
import concurrent.futures
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ("server/", "worker/", "common/", "deploy/", "python/")


def sources(build):
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    rels = (os.path.relpath(e["file"], ROOT) for e in entries)
    return sorted(r for r in rels if r.startswith(CHECKED) and r.endswith(".cc"))


def tidy(build, rel):
    """clang-tidy's checks and clang's -Wthread-safety, in one parse of `rel`."""
    # The project's own headers, wherever the clone lies (generated and
    # system headers are not ours).
    headers = "^" + re.escape(ROOT) + "/(" + "|".join(d.rstrip("/") for d in CHECKED) + ")/"
    r = subprocess.run(["clang-tidy", "-p", build, "--quiet", "--extra-arg=-Wthread-safety",
                        "--header-filter=" + headers, rel], cwd=ROOT, capture_output=True, text=True)
    lines = [l for l in r.stdout.splitlines() if ": warning: " in l or ": error: " in l]
    if r.returncode != 0 and not lines:
        lines = [f"{rel}: clang-tidy could not check it:"] + r.stderr.splitlines()[:10]
    return lines


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build"))
    files = sources(build)
    failures = []
    jobs = max(1, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for lines in pool.map(lambda f: tidy(build, f), files):
            failures += lines
    for line in sorted(set(failures)):
        print(line)
    print(f"lint: {len(files)} files (clang -Wthread-safety, clang-tidy), {len(set(failures))} findings")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
