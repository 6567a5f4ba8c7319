#!/usr/bin/env python3
"""The programs scripts/gpu-smoke starts on its GPU machine.

    python scripts/gpu_smoke_task.py task   the launched --cmd: computes on each GPU it was
                                            given, then finds its own pid on exactly those GPUs
                                            in nvidia-smi's process list
    python scripts/gpu_smoke_task.py hold   holds memory on the GPU it sees until killed

With $FAKE_NVIDIA_SMI_STATE set (gpu-smoke --dry-run) both register their pid with the fake
nvidia-smi instead of computing, as a real driver would list them.
"""
import json
import os
import subprocess
import sys
import time

FAKE_STATE = "FAKE_NVIDIA_SMI_STATE"
HOLD_MIB = 256
KEPT = []  # what the task and the holder made on their GPUs: their CUDA contexts stay


class Failed(Exception):
    pass


def smi(*args):
    """The CSV rows of one nvidia-smi query (the task's own view, without tfcluster)."""
    out = subprocess.run(["nvidia-smi"] + list(args) + ["--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise Failed("nvidia-smi %s failed (exit %d): %s" % (" ".join(args), out.returncode,
                                                            (out.stdout + out.stderr).strip()))
    return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines()
            if line.strip()]


def register_with_fake(indices, mib):
    """Dry run: the fake driver lists this process on INDICES, as a real one would."""
    path = os.environ[FAKE_STATE]
    with open(path) as handle:
        state = json.load(handle)
    state["apps"] += [{"gpu": i, "pid": os.getpid(), "used_memory": mib} for i in indices]
    with open(path + ".%d" % os.getpid(), "w") as handle:
        json.dump(state, handle)
    os.replace(path + ".%d" % os.getpid(), path)


def compute(count, mib=None):
    """Compute (or, with MIB, hold that much memory) on each of the COUNT visible GPUs with the
    first CUDA framework that sees GPUs; its name and version. What it made stays referenced,
    so its CUDA context stays while nvidia-smi is asked."""
    import numpy
    a = numpy.random.default_rng(0).random((256, 256), dtype=numpy.float32)
    tried = []
    for name in ("tensorflow", "torch", "cupy"):
        try:
            lib = __import__(name)
        except ImportError:
            continue
        if name == "tensorflow":
            seen = len(lib.config.list_physical_devices("GPU"))
        else:
            seen = lib.cuda.device_count() if name == "torch" else \
                lib.cuda.runtime.getDeviceCount()
        if seen == 0:
            tried.append("%s %s sees no GPU" % (name, lib.__version__))
            continue
        if seen != count:
            raise Failed("%s sees %d GPU(s), CUDA_VISIBLE_DEVICES names %d" % (name, seen, count))
        for k in range(count):
            result = on_gpu(name, lib, k, a, mib)
            if result is not None and not numpy.allclose(result, a @ a, rtol=1e-3):
                raise Failed("%s's matmul on its GPU %d is wrong" % (name, k))
        return "%s %s" % (name, lib.__version__)
    raise Failed("no CUDA framework computes here (%s): install tensorflow[and-cuda], torch or "
                 "cupy" % ("; ".join(tried) or "none installed"))


def on_gpu(name, lib, k, a, mib):
    """A matmul of A by itself on visible GPU K (its result), or MIB of zeros held there."""
    size = (mib or 0) * 262144  # float32s
    if name == "tensorflow":
        with lib.device("/GPU:%d" % k):
            made = lib.zeros(size) if mib else lib.matmul(a, a)
        result = None if mib else made.numpy()
    elif name == "torch":
        made = lib.zeros(size, device="cuda:%d" % k) if mib else \
            lib.tensor(a, device="cuda:%d" % k) @ lib.tensor(a, device="cuda:%d" % k)
        result = None if mib else made.cpu().numpy()
    else:
        with lib.cuda.Device(k):
            made = lib.zeros(size, dtype="float32") if mib else lib.asarray(a) @ lib.asarray(a)
            result = None if mib else lib.asnumpy(made)
    KEPT.append(made)
    return result


def visible():
    text = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if not text.strip():
        raise Failed("CUDA_VISIBLE_DEVICES=%r: no GPU was given" % text)
    return [int(i) for i in text.split(",")]


def task():
    """The launched program: compute on the GPUs given, then find its own pid on exactly them."""
    indices = visible()
    uuids = {int(i): u for i, u in smi("--query-gpu=index,uuid")}
    if os.environ.get(FAKE_STATE):
        register_with_fake(indices, 100)
        how = "nothing (dry run: registered with the fake nvidia-smi)"
    else:
        how = compute(len(indices))
    mine = {u for p, u in smi("--query-compute-apps=pid,gpu_uuid") if p == str(os.getpid())}
    wanted = {uuids[i] for i in indices}
    if mine != wanted:
        raise Failed("nvidia-smi shows pid %d on %s, but it was given GPU(s) %s (%s)" % (
            os.getpid(), sorted(mine) or "no GPU", indices, sorted(wanted)))
    print("gpu-smoke task: pid %d computed on GPU(s) %s with %s" % (
        os.getpid(), ",".join(map(str, indices)), how), flush=True)


def hold():
    """A process holding memory on the GPU it sees, until killed."""
    indices = visible()
    if os.environ.get(FAKE_STATE):
        register_with_fake(indices, 1024)
    else:
        compute(len(indices), HOLD_MIB)
    print("holding", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    try:
        {"task": task, "hold": hold}[sys.argv[1]]()
    except Failed as failure:
        print("gpu-smoke %s: FAIL: %s" % (sys.argv[1], failure), flush=True)
        sys.exit(1)
