"""``srun dpool slurm -- python prog.py`` against a real one-host Slurm (Debian's slurmctld,
slurmd and munge, started here): a 2-task step becomes a head and a node on two loopback
addresses, the program's tasks run on both, its exit status is the step's, and nothing
is left behind; two such jobs at once both pass. Skipped, saying why, where Slurm cannot
be installed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import psutil
import pytest

from tests.cluster.conftest import ROOT, TIMEOUT, base_env
from tests.cluster.slurm_helpers import SlurmUnavailable, start_slurm

PROGRAM = textwrap.dedent("""
    import os, sys, time
    import dpool

    def where(t):
        time.sleep(t)
        return os.environ.get("DPOOL_NODE_ID")

    if __name__ == "__main__":
        with dpool.ProcessPoolExecutor() as ex:
            nodes = sorted(set(ex.map(where, [0.3] * 12)))
        print("NODES", len(nodes), *nodes)
        sys.exit(int(sys.argv[1]))
""")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        s = start_slurm(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield s
    finally:
        s.stop()


def _srun(slurm, workdir, exit_code: int, octet: int) -> subprocess.Popen:
    env = {**base_env(), "SLURM_CONF": slurm.env["SLURM_CONF"]}
    (workdir / "prog.py").write_text(PROGRAM)
    return subprocess.Popen(
        ["srun", "-n", "2", sys.executable, "-m", "dpool", "slurm",
         "--node-ip", f"127.{octet}.{{rank}}.1", "--", sys.executable, "prog.py",
         str(exit_code)],
        env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _dpool_processes() -> list:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "dpool slurm" in cmd or ("dpool.node" in cmd and "dpool-slurm-" in cmd):
            out.append(p)
    return out


def test_a_step_runs_the_program_on_a_cluster_of_its_ranks(slurm, tmp_path):
    proc = _srun(slurm, tmp_path, 3, 40)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 3, err  # the program's exit status is the step's
    line = [x for x in out.splitlines() if x.startswith("NODES")]
    assert line and line[0].split()[1] == "2", out + err  # tasks ran on both nodes
    assert {n.split(":")[0] for n in line[0].split()[2:]} == {"127.40.0.1", "127.40.1.1"}
    assert "DPOOL_TOKEN" not in out + err  # the token is never printed
    assert not (tmp_path / ".dpool-slurm").exists()
    assert not _dpool_processes()


def test_two_jobs_at_once_both_pass(slurm, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _srun(slurm, tmp_path / "a", 0, 41)
    b = _srun(slurm, tmp_path / "b", 0, 42)
    for proc in (a, b):
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err
        assert "NODES 2" in out, out + err
    assert not _dpool_processes()


def test_outside_a_slurm_step_it_says_so():
    env = base_env()
    for k in [k for k in env if k.startswith("SLURM_")]:
        del env[k]
    out = subprocess.run([sys.executable, "-m", "dpool", "slurm", "--", "true"], env=env,
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2
    assert "not in a Slurm step" in out.stderr and "srun" in out.stderr


def test_the_example_sbatch_script_names_the_launcher():
    script = open(os.path.join(ROOT, "examples", "slurm", "job.sbatch")).read()
    assert "srun" in script and "dpool slurm" in script
