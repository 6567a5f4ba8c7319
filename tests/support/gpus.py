"""GPUs without a GPU: tests/programs/nvidia-smi answers nvidia-smi's query interface from a state
file (FakeGpus) each test writes, with fresh GPU UUIDs each time, so claims never collide with
another test session's. The fixtures `fake_gpus` (the fake on PATH) and `smi_in_process` (the
same fake, run in this process) are registered in tests/conftest.py."""
import json
import os
import subprocess
import uuid

import pytest

from support import REPO
from support.ports import free_port_block
from support.procs import stop_leftovers
from tfcluster.hosts.inventory import Machine, Slot
from tfcluster.runs.record import PreflightReport
from tfcluster_agent import gpuclaims, gpuinfo

FAKE_SMI = os.path.join(REPO, "tests", "programs", "nvidia-smi")


class FakeGpus:
    """A state file for the fake nvidia-smi, and the processes that "use" its GPUs."""

    def __init__(self, path, count=4):
        self.path = str(path)
        tag = uuid.uuid4().hex[:8]
        self.state = {"driver": "550.54.15", "apps": [],
                      "gpus": [{"uuid": "GPU-%s-%04d-test-0000-000000000000" % (tag, i)}
                               for i in range(count)]}
        self.users = []
        self.save()

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(self.state, handle)
        os.replace(tmp, self.path)

    def set(self, index, **fields):
        self.state["gpus"][index].update(fields)
        self.save()

    def use(self, index, mib=10240):
        """A process (sleep) computing on GPU INDEX until stopped; its pid."""
        proc = subprocess.Popen(["sleep", "600"])
        self.users.append(proc)
        self.state["apps"].append({"gpu": index, "pid": proc.pid, "used_memory": mib})
        self.save()
        return proc.pid

    def uuids(self):
        return [g["uuid"] for g in self.state["gpus"]]

    def env(self):
        return {"FAKE_NVIDIA_SMI_STATE": self.path}

    def close(self):
        for proc in self.users:
            proc.kill()
            proc.wait()
        for gpu_uuid in self.uuids():
            try:
                os.unlink(gpuclaims.claim_path(gpu_uuid))
            except OSError:
                pass


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    fake = FakeGpus(tmp_path / "gpus.json")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(FAKE_SMI, bin_dir / "nvidia-smi")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", fake.path)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    # This test's own claims and queue (its launches' agents inherit the variable): another
    # test session's waiting run must not stand ahead of its claims.
    claims = str(tmp_path / "claims")
    monkeypatch.setenv("TFCLUSTER_GPU_CLAIMS_DIR", claims)
    monkeypatch.setattr(gpuclaims, "CLAIMS_DIR", claims)
    yield fake
    fake.close()
    leftovers = stop_leftovers(str(tmp_path))
    assert not leftovers, "processes of the test were still running: %s" % leftovers


@pytest.fixture
def smi_in_process(monkeypatch):
    """The same fake, run in this process: the fast tests start no interpreter per query."""
    import contextlib
    import importlib.machinery
    import importlib.util
    import io
    loader = importlib.machinery.SourceFileLoader("fake_nvidia_smi", FAKE_SMI)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)

    def run(argv, timeout):
        if os.sep in argv[0] and not os.path.exists(argv[0]):
            raise FileNotFoundError(2, "No such file or directory")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                code = module.main(argv[1:])
            except SystemExit as exit:
                code = exit.code
        return gpuinfo.Answer(code, out.getvalue(), "")

    monkeypatch.setattr(gpuinfo, "run_smi", run)


def local_slots(count=2, gpus_listed=None, **machine):
    """COUNT worker slots on one local machine, without reading an inventory (fast)."""
    host = Machine(address=machine.pop("address", "localhost"), connection="local", **machine)
    return [Slot("worker%d" % i, "worker", host, port_base=free_port_block(),
                 gpus=(gpus_listed or {}).get(i)) for i in range(count)]


def reports_for(cluster):
    """What preflight reports, GPU part only: the agent's own query of the fake."""
    facts = gpuinfo.host_gpus()
    return {m.key: PreflightReport(python_ok=True, gpus=gpuinfo.smi_lines(facts), gpu_facts=facts)
            for m, _ in cluster.machines()}


def outcomes_of(found):
    """Hosts.each's Outcomes of {machine key: GPU facts or HostError}."""
    from tfcluster.hosts.links import HostError
    from tfcluster.hosts.fanout import Outcomes
    outcomes = Outcomes()
    for key, value in found.items():
        (outcomes.failed if isinstance(value, HostError) else outcomes.succeeded)[key] = value
    return outcomes
