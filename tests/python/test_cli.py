"""python -m libmha validate and bench, as a user runs them."""
import re
import subprocess
import sys

import libmha


def run(*args):
    return subprocess.run([sys.executable, "-m", "libmha", *args], capture_output=True, text=True,
                          timeout=300)


def test_validate_runs_mha_validate():
    r = run("validate", "--shape", "2,5,7,4,2,16,48")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"libmha {libmha.__version__}" in r.stdout
    assert "all ISAs within tolerance" in r.stdout
    for isa in libmha.isa_available()[1:]:
        assert re.search(rf"^attention +{isa} ", r.stdout, re.M)


def test_validate_bad_arguments():
    r = run("validate", "--shape", "1,2")
    assert r.returncode == 2 and "usage" in r.stderr


def test_bench_prints_a_row_per_isa():
    r = run("bench", "--shape", "1,8,8,2,1,8,16", "--shape", "1,4,9,2,2,8,16", "--runs", "1")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    assert [(row[0], row[1]) for row in rows] == \
        [(s, isa) for s in ("1,8,8,2,1,8,16", "1,4,9,2,2,8,16") for isa in libmha.isa_available()]
    assert all(float(x) > 0 for row in rows for x in row[2:])


def test_bench_bad_arguments():
    for args in (["--shape", "1,2,3"], ["--shape", "1,8,8,3,2,8,16"], ["--runs", "0"]):
        r = run("bench", *args)
        assert r.returncode == 2 and "error" in r.stderr
