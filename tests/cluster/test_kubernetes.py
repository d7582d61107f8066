"""The Kubernetes manifests of ``examples/kubernetes``: valid against Kubernetes' own
schemas (``kubernetes-validate``, offline), and their entrypoints and probes, run here as
processes the way the pods run them: a head and two worker nodes started with their
containers' ``--block`` commands, ready by their readiness probes, the Job's init
container satisfied once all three are up, a program run on them, and every one stopped
cleanly by SIGTERM, as a pod's deletion sends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.cluster.conftest import ROOT, TIMEOUT, base_env, free_port, host, nodes_used

yaml = pytest.importorskip("yaml")
MANIFESTS = ROOT / "examples" / "kubernetes"


def _docs() -> list:
    out = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def _container(kind: str, name: str) -> dict:
    for _f, d in _docs():
        if d["kind"] == kind and d["metadata"]["name"] == name:
            spec = d["spec"]["template"]["spec"]
            return spec
    raise AssertionError(f"no {kind} {name}")


def test_manifests_are_valid_kubernetes_objects():
    kv = pytest.importorskip("kubernetes_validate")
    docs = _docs()
    assert {d["kind"] for _f, d in docs} >= {"Service", "Deployment", "Job"}
    for name, d in docs:
        kv.validate(d, "1.30.0", strict=True)  # raises ValidationError saying what is wrong
    broken = dict(_docs()[1][1])  # (the checker does check: a wrong type is caught)
    broken["spec"] = {**broken["spec"], "replicas": "two"}
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, "1.30.0", strict=True)
    # the token only ever from the Secret, never in a command line
    for _name, d in docs:
        assert "--token" not in str(d)


def _argv(container: dict, subst: dict) -> list:
    argv = [*container.get("command", []), *container.get("args", [])]
    out = []
    for a in argv:
        for k, v in subst.items():
            a = a.replace(k, v)
        out.append(a)
    if out and out[0] == "dpool":
        out = [sys.executable, "-m", "dpool", *out[1:]]
    return out


def test_entrypoints_and_probes_as_processes(tmp_path):
    token = "k8s-test-token-0123456789abcdef"
    port = free_port(host(2), span=12)
    head_ip, worker_ips = host(2), [host(3), host(4)]
    head_c = _container("Deployment", "dpool-head")["containers"][0]
    worker_c = _container("Deployment", "dpool-workers")["containers"][0]
    job = _container("Job", "dpool-program")
    pods: list = []
    envs = []

    def pod(container: dict, ip: str, name: str) -> dict:
        env = {**base_env(), "DPOOL_TOKEN": token, "POD_IP": ip,
               "DPOOL_STATE_DIR": str(tmp_path / name)}
        argv = _argv(container, {"$(POD_IP)": ip, "6380": str(port),
                                 "dpool-head:": f"{head_ip}:"})
        pods.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))
        envs.append(env)
        return env

    try:
        head_env = pod(head_c, head_ip, "head")
        probe = _argv(head_c["readinessProbe"]["exec"], {})
        probe = [*probe[:-1], str(TIMEOUT)]  # (a probe repeats; here: once, patiently)
        ready = subprocess.run(probe, env=head_env, capture_output=True, text=True,
                               timeout=TIMEOUT + 10)
        assert ready.returncode == 0, ready.stderr
        for i, ip in enumerate(worker_ips):
            env = pod(worker_c, ip, f"worker{i}")
            ready = subprocess.run([*_argv(worker_c["readinessProbe"]["exec"], {})[:-1],
                                    str(TIMEOUT)], env=env, capture_output=True, text=True,
                                   timeout=TIMEOUT + 10)
            assert ready.returncode == 0, ready.stderr
        init = _argv(job["initContainers"][0], {"dpool-head:6380": f"{head_ip}:{port}"})
        env = {**base_env(), "DPOOL_TOKEN": token}
        waited = subprocess.run(init, env=env, capture_output=True, text=True,
                                timeout=TIMEOUT + 10)
        assert waited.returncode == 0, waited.stderr
        used = nodes_used({**env, "DPOOL_ADDRESS": f"{head_ip}:{port}"}, tmp_path)
        assert used >= 2  # tasks on more than one pod's node
        for p in reversed(pods):  # the workers' pods deleted first, then the head's
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0
        for e in envs:
            assert not os.path.exists(os.path.join(e["DPOOL_STATE_DIR"], "cluster.json"))
    finally:
        for p in pods:
            if p.poll() is None:
                p.kill()
                p.wait()
        for e in envs:
            subprocess.run([sys.executable, "-m", "dpool", "stop"], env=e,
                           capture_output=True, timeout=TIMEOUT)
