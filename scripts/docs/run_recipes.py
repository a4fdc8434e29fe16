#!/usr/bin/python3
"""Runs every recipe in README.md and docs/ as a reader would paste it, so none can rot.

A recipe is a fenced ```sh or ```python block right after the line `<!-- recipe -->` (invisible on the
page). Each runs as one pasted block: shell recipes with `bash -e`, Python ones with /usr/bin/python3, from
the top of the source tree, with bin/ on PATH and clients/python on PYTHONPATH, and in an environment whose
`python3` is one WITHOUT numpy (a shim), so a recipe that says `python3` where it needs numpy fails here as
it would for a user whose first python3 lacks it. Rings go to a private ring directory
($IBVBRIDGE_RING_DIR, removed afterwards) and each recipe gets its own working directory. A recipe may
leave background jobs: they must end by themselves within its time limit (`<!-- recipe timeout=60 -->`).

    run_recipes.py [FILE...]        (default: README.md and docs/**/*.md)
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = re.compile(r"^<!-- recipe(?: timeout=(\d+))? -->\s*$")
FENCE = re.compile(r"^```(sh|bash|python)\s*$")


def recipes(path):
    lines = open(path).read().splitlines()
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if m:
            f = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            if not f:
                raise SystemExit(f"{path}:{i + 1}: <!-- recipe --> must stand right before a ```sh or ```python block")
            j = i + 2
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            yield i + 1, f.group(1), "\n".join(lines[i + 2:j]) + "\n", int(m.group(1) or 60)
            i = j
        i += 1


def shim_dir(tmp):
    """A bin directory whose python3 has no numpy (exits as an interpreter without it would)."""
    d = os.path.join(tmp, "shim")
    os.makedirs(d)
    with open(os.path.join(d, "python3"), "w") as f:
        f.write("#!/bin/sh\n# a python3 without numpy, as a pyenv or a venv may be\n"
                "exec /usr/bin/python3 -S -c 'import sys; sys.path=[p for p in sys.path if \"dist-packages\" not in p]; "
                "sys.argv=sys.argv[1:]; import runpy; runpy.run_path(sys.argv[0], run_name=\"__main__\")' \"$@\"\n")
    os.chmod(os.path.join(d, "python3"), 0o755)
    return d


def run(path, line, lang, body, timeout, tmp):
    work = tempfile.mkdtemp(dir=tmp)
    ringdir = tempfile.mkdtemp(dir=tmp)
    os.chmod(ringdir, 0o700)
    env = dict(os.environ)
    env.update(PATH=f"{shim_dir(work)}:{ROOT}/bin:{ROOT}/clients/c/build:{env.get('PATH', '')}",
               PYTHONPATH=f"{ROOT}/clients/python", IBVBRIDGE_RING_DIR=ringdir, PYENV_VERSION="system",
               IBVBRIDGE_SRC=ROOT)
    if lang == "python":
        cmd = ["/usr/bin/python3", "-c", body]
    else:
        # every background job must succeed too: a pasted block whose consumer failed has failed
        cmd = ["bash", "-e", "-c", f"cd {ROOT}\n{body}\nfor j in $(jobs -p); do wait $j; done\n"]
    p = subprocess.Popen(cmd, cwd=ROOT if lang == "python" else work, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc = "timeout"
    try:
        os.killpg(p.pid, signal.SIGKILL)  # anything the recipe left behind
    except ProcessLookupError:
        pass
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(ringdir, ignore_errors=True)
    return rc, out


def main():
    files = sys.argv[1:] or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="ibvb-recipes-") as tmp:
        for path in files:
            for line, lang, body, timeout in recipes(path):
                rel = os.path.relpath(path, ROOT)
                rc, out = run(path, line, lang, body, timeout, tmp)
                if rc == 0:
                    passed += 1
                    print(f"ok   {rel}:{line}")
                    if os.environ.get("RECIPES_VERBOSE"):
                        print("".join("     | " + l + "\n" for l in out.splitlines()[-12:]))
                else:
                    failed += 1
                    print(f"FAIL {rel}:{line} ({rc})\n" + "".join("     | " + l + "\n" for l in out.splitlines()[-25:]))
    print(f"recipes: {passed} passed, {failed} failed")
    sys.exit(1 if failed or not passed else 0)


if __name__ == "__main__":
    main()
