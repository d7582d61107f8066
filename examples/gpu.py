"""GPU tasks: the same program on a CPU-only laptop and on a GPU node.

Each task asks for half a GPU (two share a device) and multiplies matrices there -- with
torch or cupy when installed and a GPU is really there, else with numpy on the CPU. Its
worker sees only the GPU it was given (``CUDA_VISIBLE_DEVICES``), set before the task's
code runs, so ``cuda:0`` inside the task is that GPU.

Without a GPU, the embedded runtime is told it has one (``runtime_resources``): a *fake*
GPU, so the GPU code path is exercised everywhere. On a GPU machine, or in a cluster
(``DPOOL_ADDRESS`` set; nodes say what they have with ``dpool start --num-gpus``), the
real ones are used.
"""

import os
import shutil
import subprocess

import numpy as np

import dpool
from dpool import ProcessPoolExecutor


def has_gpu() -> bool:
    """Whether this host has an NVIDIA GPU -- asked without touching CUDA here (a driver
    that initializes CUDA before its workers fork leaves them unable to use it)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return out.returncode == 0 and "GPU" in out.stdout


def matmul_checksum(seed: int, n: int = 512) -> tuple:
    """(backend, the task's GPU ids, CUDA_VISIBLE_DEVICES, checksum of a @ a.T)."""
    a = np.random.default_rng(seed).standard_normal((n, n), dtype=np.float32)
    backend, total = "numpy", None
    try:
        import torch

        if torch.cuda.is_available():
            t = torch.from_numpy(a).to("cuda:0")  # the task's own GPU
            total = float((t @ t.T).sum().item())
            backend = f"torch on {torch.cuda.get_device_name(0)}"
    except ImportError:
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() > 0:
                c = cupy.asarray(a)
                total = float((c @ c.T).sum())
                backend = "cupy"
        except Exception:  # noqa: BLE001 - no cupy, or no device: numpy below
            pass
    if total is None:
        total = float((a @ a.T).sum())
    return backend, dpool.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"), total


def main() -> None:
    fake = not has_gpu() and not os.environ.get("DPOOL_ADDRESS") \
        and not os.environ.get("DPOOL_NUM_GPUS")
    offer = {"GPU": 1} if fake else None
    with ProcessPoolExecutor(max_workers=4, runtime_resources=offer) as ex:
        half = ex.options(num_gpus=0.5)
        results = list(half.map(matmul_checksum, range(4)))
    for seed, (backend, ids, visible, total) in enumerate(results):
        print(f"task {seed}: GPU ids {ids} (CUDA_VISIBLE_DEVICES={visible}), {backend}")
    expected = [float((a @ a.T).sum()) for a in (
        np.random.default_rng(s).standard_normal((512, 512), dtype=np.float32)
        for s in range(4))]
    agree = all(abs(r[3] - e) <= 1e-3 * max(1.0, abs(e)) for r, e in zip(results, expected))
    print(f"{'fake' if fake else 'real'} GPU; every task had one: "
          f"{all(len(r[1]) == 1 for r in results)}; results agree: {agree}")


if __name__ == "__main__":
    main()
