"""deploy/Containerfile: what can be checked without building the image.

No image registry is reachable where the tests run, so the image itself is never built
here (docs/deploy.md). Checked instead: every file it copies from the tree exists, the
extras it installs are extras seamguard declares, its entrypoint is seamguard's console
script, both stages start from a pinned image, the final stage runs as a non-root user,
and the wheel its first stage builds — from exactly the files it copies — builds here
and carries the package data the daemons load at run time.
"""

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            op, _, args = line.strip().partition(" ")
            out.append((op.upper(), args.strip()))
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for op, args in instructions(text):
        if op == "FROM":
            out.append([])
        out[-1].append((op, args))
    return out


def test_two_stages_from_pinned_images():
    st = stages(CONTAINERFILE.read_text())
    assert len(st) == 2
    for s in st:
        image = s[0][1].split()[0]
        assert re.search(r":[\w.-]+$", image) and not image.endswith(":latest"), image


def test_copied_files_exist():
    for op, args in instructions(CONTAINERFILE.read_text()):
        if op == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                assert (ROOT / src).exists(), f"COPY {src}: not in the tree"


def test_installs_declared_extras_and_runs_the_console_script_as_non_root():
    final = stages(CONTAINERFILE.read_text())[-1]
    run = " ".join(a for op, a in final if op == "RUN")
    extras = re.search(r"\[([a-z0-9_,-]+)\]", run).group(1).split(",")
    assert set(extras) <= set(PYPROJECT["project"]["optional-dependencies"]), extras
    assert {"service", "gateway", "nvml", "k8s", "ha"} <= set(extras), "the three daemons' extras"
    assert "-c /tmp/constraints.txt" in run, "installed at the locked versions"
    user = [a for op, a in final if op == "USER"][-1].split(":")[0]
    assert user not in ("0", "root")
    entry = [a for op, a in final if op == "ENTRYPOINT"][-1]
    assert entry == '["seamguard"]' and "seamguard" in PYPROJECT["project"]["scripts"]


@pytest.mark.slow
def test_the_first_stage_builds_the_wheel_from_what_it_copies(tmp_path):
    first = stages(CONTAINERFILE.read_text())[0]
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    for op, args in first:
        if op == "COPY":
            *srcs, dest = args.split()
            where = ctx / dest.removeprefix("./")
            for s in srcs:
                target = where / Path(s).name if dest.endswith("/") else where
                subprocess.run(["cp", "-r", str(ROOT / s), str(target)], check=True)
    for p in ctx.rglob("__pycache__"):
        subprocess.run(["rm", "-rf", str(p)], check=True)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "--wheel-dir", str(tmp_path / "wheels"), str(ctx)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    (whl,) = (tmp_path / "wheels").glob("seamguard-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    assert {"seamguard/decide/default_policy.yaml", "seamguard/app/service/static/index.html",
            "seamguard/app/cli.py"} <= names
