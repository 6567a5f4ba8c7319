"""deploy.yml, stop.yml and teardown.yml on 3 real SSH test hosts (network namespaces).

The module-scoped fixture `deployed` builds the wheelhouse (scripts/wheelhouse, pip's cache makes
reruns fast), brings the test hosts up (fixture `testhosts`), and runs a first offline deploy.
Tests run in file order against it: idempotence, a --check run of the GPU path, TensorFlow and
the trainer code hash over SSH, stop.yml, and teardown.yml last. The finalizer runs teardown.yml
again (whatever happened) and stops the SSH connections Ansible kept open; the session fixture
`testhosts` brings the hosts down.

Tests that launch across the deployed hosts take the `deployed` fixture and go where the marker
comment is, before test_teardown_removes_everything (tests run in file order).
"""
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

if os.geteuid() != 0:
    pytest.skip("test_deploy needs root: the test hosts are network namespaces",
                allow_module_level=True)

from fixtures_testhosts import testhosts  # noqa: E402,F401,F811  (session fixture, used by name)

pytestmark = [pytest.mark.slow, pytest.mark.root]

ROOT = "/opt/tfcluster"
TF_VERSION = "2.21.0"
DEFAULT_PACKAGES = ["python3", "python3-venv", "pciutils"]  # roles/common/defaults/main.yml
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
                   r"\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)", re.M)
TASK = re.compile(r"^TASK \[(.+?)\] \*+$")
STATUS = re.compile(r"^(ok|changed|skipping|fatal|failed|included): \[([^\]\s]+?)(?: -> [^\]]+)?\]")


def _tool(name):
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else shutil.which(name)


class Ansible:
    """Runs the repository's playbooks against the test hosts; records output and timings."""

    def __init__(self, inventory, extra_vars_file, workdir):
        self.inventory = str(inventory)
        self.extra_vars_file = extra_vars_file
        self.workdir = workdir
        # Ansible's SSH connections (ControlPersist) live in a folder of our own: close() ends them.
        self.control_dir = os.path.join(workdir, "cp")
        os.makedirs(self.control_dir, exist_ok=True)
        self.timings = []
        self.count = 0

    def run(self, playbook, *args, label=None, timeout=900):
        self.count += 1
        argv = [_tool("ansible-playbook"), "-i", self.inventory, "playbooks/" + playbook,
                "-e", "@" + self.extra_vars_file, *args]
        env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                   ANSIBLE_SSH_CONTROL_PATH_DIR=self.control_dir, ANSIBLE_RETRY_FILES_ENABLED="0")
        started = time.monotonic()
        proc = subprocess.run(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
        elapsed = time.monotonic() - started
        self.timings.append((label or " ".join([playbook, *args]), elapsed))
        log = os.path.join(self.workdir, "ansible-%02d-%s.log" % (self.count, playbook))
        with open(log, "w") as handle:
            handle.write("$ %s\n%s\n--- stderr ---\n%s" % (" ".join(argv), proc.stdout, proc.stderr))
        proc.log = log
        proc.recap = {m.group(1): dict(zip(
            ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored"),
            map(int, m.groups()[1:]))) for m in RECAP.finditer(proc.stdout)}
        return proc

    def close(self):
        """End the SSH master connections Ansible left running (ControlPersist)."""
        for name in os.listdir(self.control_dir):
            subprocess.run(["ssh", "-O", "exit", "-o", "ControlPath=" + os.path.join(
                self.control_dir, name), "tfcluster-test"], capture_output=True, timeout=10)


def explain(proc):
    return "ansible-playbook exited %d (log %s):\n%s\n%s" % (
        proc.returncode, proc.log, proc.stdout[-6000:], proc.stderr[-2000:])


def task_statuses(output):
    """{(task name, host): status} from the default callback's output."""
    statuses, task = {}, None
    for line in output.splitlines():
        match = TASK.match(line)
        if match:
            task = match.group(1)
            continue
        match = STATUS.match(line)
        if match and task:
            statuses.setdefault((task, match.group(2)), match.group(1))
    return statuses


def installed(package):
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True,
                         text=True)
    return out.returncode == 0 and out.stdout.strip().endswith(" installed")


def tiny_dataset(folder):
    """A fake data set: two files in the controller cache (one an archive to extract) and one
    that only a mirror has, the first mirror being broken. Returns (manifest, cache dir)."""
    cache = os.path.join(folder, "cache", "tiny")
    mirror = os.path.join(folder, "mirror")
    os.makedirs(cache)
    os.makedirs(mirror)
    files = {}
    with open(os.path.join(cache, "tiny.txt"), "w") as handle:
        handle.write("tiny data set\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"inside the archive\n"
        info = tarfile.TarInfo("tiny-batches/inner.txt")
        info.size = len(data)
        info.mtime = 1700000000
        tar.addfile(info, io.BytesIO(data))
    with open(os.path.join(cache, "tiny.tar.gz"), "wb") as handle:
        handle.write(buf.getvalue())
    with open(os.path.join(mirror, "remote.txt"), "w") as handle:
        handle.write("downloaded from the second mirror\n")
    for name, path in (("tiny.txt", cache), ("tiny.tar.gz", cache), ("remote.txt", mirror)):
        with open(os.path.join(path, name), "rb") as handle:
            files[name] = hashlib.sha256(handle.read()).hexdigest()
    manifest = {"tiny": {"description": "test data", "files": [
        {"name": "tiny.txt", "sha256": files["tiny.txt"], "urls": ["file:///nonexistent/tiny.txt"]},
        {"name": "tiny.tar.gz", "sha256": files["tiny.tar.gz"], "extract": True,
         "urls": ["file:///nonexistent/tiny.tar.gz"]},
        {"name": "remote.txt", "sha256": files["remote.txt"],
         "urls": ["file:///nonexistent/remote.txt", "file://" + os.path.join(mirror, "remote.txt")]},
    ]}}
    path = os.path.join(folder, "datasets.json")
    with open(path, "w") as handle:
        json.dump(manifest, handle)
    return path, os.path.join(folder, "cache")


@pytest.fixture(scope="module")
def deployed(testhosts, tmp_path_factory, request):
    """Test hosts after a first offline deploy: (testhosts, Ansible runner, first run)."""
    work = str(tmp_path_factory.mktemp("deploy"))
    reporter = request.config.pluginmanager.getplugin("terminalreporter")

    started = time.monotonic()
    wheelhouse = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "wheelhouse")],
                                cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert wheelhouse.returncode == 0, "scripts/wheelhouse failed:\n%s\n%s" % (
        wheelhouse.stdout[-3000:], wheelhouse.stderr[-3000:])
    wheelhouse_time = time.monotonic() - started

    # The hosts share this machine's /usr and reach no package registry: ask only for the
    # packages that are here (pciutils may be missing; lspci is optional for the GPU fact).
    packages = [p for p in DEFAULT_PACKAGES if installed(p)]
    assert "python3-venv" in packages, "the test hosts need python3-venv on this machine"
    # A snapshot of trainers/: the code deployed and hashed cannot change under the tests.
    trainers = os.path.join(work, "trainers")
    shutil.copytree(os.path.join(REPO, "trainers"), trainers, symlinks=True)
    manifest, cache = tiny_dataset(os.path.join(work, "data"))
    extra = os.path.join(work, "extra-vars.json")
    with open(extra, "w") as handle:
        # No byte-compiling: about 70 s less for three installs sharing two cores.
        json.dump({"tensorflow_install_mode": "offline", "tensorflow_pip_compile": False,
                   "common_packages": packages,
                   "trainers_src": trainers, "datasets_names": ["tiny"],
                   "datasets_manifest": manifest, "datasets_cache_dir": cache}, handle)

    ansible = Ansible(testhosts.inventory, extra, work)
    ansible.torn_down = False
    try:
        first = ansible.run("deploy.yml", "-e", "tensorflow_install_mode=offline",
                            label="first deploy")
        assert first.returncode == 0, explain(first)
        yield testhosts, ansible, first
    finally:
        final = None
        if not ansible.torn_down:  # test_teardown_removes_everything did not run or failed
            final = ansible.run("teardown.yml", "-e", "common_remove_user=true",
                                label="teardown (finalizer)")
        ansible.close()
        lines = ["", "test_deploy timings (s): wheelhouse %.1f" % wheelhouse_time]
        lines += ["  %-32s %6.1f" % (label, seconds) for label, seconds in ansible.timings]
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n".join(lines))
        assert final is None or final.returncode == 0, explain(final)


def test_first_deploy_provisions_every_host(deployed):
    hosts, _, first = deployed
    names = [name for name, _ in hosts.hosts]
    for name in names:
        assert first.recap[name]["failed"] == 0 and first.recap[name]["unreachable"] == 0
        assert first.recap[name]["changed"] > 0, "%s: the first deploy changed nothing" % name
    for name in names:
        out = hosts.ssh(name, "cat %s/data/tiny/tiny.txt %s/data/tiny/tiny-batches/inner.txt "
                                  "%s/data/tiny/remote.txt && stat -c %%a %s/work"
                            % (ROOT, ROOT, ROOT, ROOT))
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[:3] == ["tiny data set", "inside the archive",
                                               "downloaded from the second mirror"]
        assert out.stdout.split()[-1] == "3775"
        fence = subprocess.run(hosts.netns_argv(name) + ["nft", "list", "table", "inet",
                                                         "tfcluster"], capture_output=True)
        assert fence.returncode == 0, "%s: the firewall role loaded no fence" % name


def test_second_deploy_changes_nothing(deployed):
    hosts, ansible, _ = deployed
    second = ansible.run("deploy.yml", "-e", "tensorflow_install_mode=offline",
                         label="second deploy")
    assert second.returncode == 0, explain(second)
    for name, _ in hosts.hosts:
        assert second.recap[name]["changed"] == 0, "%s changed on a second deploy:\n%s" % (
            name, "\n".join(line for line in second.stdout.splitlines()
                            if line.startswith("changed:")) or explain(second))
        assert second.recap[name]["failed"] == 0


def test_check_mode_runs_the_gpu_roles_without_failing(deployed):
    hosts, ansible, _ = deployed
    # A stale file the next real deploy would delete: --check must report it and leave it.
    stale = "%s/trainers/stale_module.py" % ROOT
    assert hosts.ssh("th2", "echo 'x = 1' > %s" % stale).returncode == 0
    try:
        # One host walks the whole GPU path; three would share two cores for nothing more.
        check = ansible.run("deploy.yml", "--check", "--limit", "th2",
                            "-e", "tensorflow_install_mode=offline", "-e", "tfcluster_gpu=true",
                            "-e", "nvidia_driver_skip_reboot=true", "-e", "cuda_install=true",
                            label="deploy --check, GPU forced")
        assert check.returncode == 0, explain(check)
        statuses = task_statuses(check.stdout)
        assert set(check.recap) == {"th2"}, explain(check)
        assert check.recap["th2"]["failed"] == 0, explain(check)
        for task in ("nvidia_driver : Ensure the kernel headers of the running kernel are installed",
                     "nvidia_driver : Ensure NVIDIA's repository key is installed",
                     "nvidia_driver : Ensure NVIDIA's repository is an apt source",
                     "nvidia_driver : Ensure the NVIDIA driver packages are installed, open modules of branch 580",
                     "nvidia_driver : Decide whether a reboot must load the installed driver",
                     "nvidia_driver : Ensure nouveau is blacklisted",
                     "nvidia_driver : Check that nvidia-smi lists the GPUs",
                     "cuda : Ensure the CUDA toolkit packages are installed"):
            assert statuses.get((task, "th2")) not in (None, "skipping"), (
                "task %r did not run in --check: %s" % (task, statuses.get((task, "th2"))))
        assert statuses[("trainers : Ensure files no longer in the repository are gone from the host",
                         "th2")] == "changed"
        assert hosts.ssh("th2", "test -e %s" % stale).returncode == 0
        # The dry run changed nothing (the test hosts share this machine's /etc).
        assert not os.path.exists("/etc/modprobe.d/blacklist-nouveau.conf")
        assert not os.path.exists("/etc/apt/sources.list.d/tfcluster-debian-extra.sources")
        assert not os.path.exists("/etc/apt/sources.list.d/nvidia-cuda.sources")
    finally:
        hosts.ssh("th2", "rm -f %s" % stale)


def test_tensorflow_imports_on_every_host(deployed):
    hosts, _, _ = deployed
    probe = ("import json, tensorflow as tf; print(json.dumps([tf.__version__, "
             "len(tf.config.list_physical_devices('GPU'))]))")
    procs = {name: subprocess.Popen(hosts.ssh_argv(name, "TF_CPP_MIN_LOG_LEVEL=3 %s/venv/bin/python -c \"%s\""
                                                       % (ROOT, probe)),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, _ in hosts.hosts}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, "%s: %s" % (name, err[-2000:])
        assert json.loads(out.strip().splitlines()[-1]) == [TF_VERSION, 0]


def test_trainer_code_hash_matches(deployed):
    hosts, ansible, _ = deployed
    trainers = json.load(open(ansible.extra_vars_file))["trainers_src"]
    expected = subprocess.run([sys.executable, os.path.join(trainers, "agent.py"), "hash", "--dir",
                               trainers], capture_output=True, text=True, check=True).stdout.strip()
    for name, _ in hosts.hosts:
        out = hosts.ssh(name, "cat {0}/trainers.sha256; {0}/venv/bin/python {0}/trainers/agent.py "
                                  "hash --dir {0}/trainers; find {0}/trainers -name '*.pyc' | wc -l"
                            .format(ROOT))
        assert out.returncode == 0, out.stderr
        recorded, computed, pyc = out.stdout.split()
        assert recorded == computed == expected, name
        assert pyc == "0", "%s: compiled files were shipped" % name


def test_stop_stops_running_tasks(deployed, tmp_path):
    """stop.yml stops what a detached launch left running on the workers' hosts."""
    from conftest import run_record, tfcluster
    hosts, ansible, _ = deployed
    runs_dir = str(tmp_path / "runs")
    proc = tfcluster("launch", "--cmd", "exec sleep 600", "-i", str(hosts.inventory), "--ps", "0",
                     "--detach", runs_dir=runs_dir, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    pids = {t["host"]: t["pid"] for t in run_record(runs_dir)["tasks"].values()}
    assert len(pids) == 2 and all(pids.values())
    stop = ansible.run("stop.yml", label="stop (2 tasks running)")
    assert stop.returncode == 0, explain(stop)
    assert stop.recap["th1"]["changed"] == 0
    assert stop.recap["th2"]["changed"] == 1 and stop.recap["th3"]["changed"] == 1, explain(stop)
    for name, address in hosts.hosts:
        if address in pids:
            gone = hosts.ssh(name, "kill -0 %d" % pids[address])
            assert gone.returncode != 0, "%s: task %d still running" % (name, pids[address])
    again = ansible.run("stop.yml", label="stop (nothing running)")
    assert again.returncode == 0, explain(again)
    assert all(again.recap[name]["changed"] == 0 for name, _ in hosts.hosts)
    # The run's own stop now finds nothing to stop and closes the record.
    assert tfcluster("stop", runs_dir=runs_dir, timeout=120).returncode == 0


def test_launch_across_the_deployed_hosts(deployed, tmp_path):
    """The ps on th1 serves workers on th2 and th3, all from the deployed venv and code."""
    from conftest import run_record, tfcluster
    hosts, _, _ = deployed
    runs_dir = str(tmp_path / "runs")
    proc = tfcluster("launch", "mnist_replica", "-i", str(hosts.inventory), "--smoke",
                     "--timeout", "300", runs_dir=runs_dir, timeout=420)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    record = run_record(runs_dir)
    addresses = dict(hosts.hosts)
    assert record["cluster"] == {"ps": ["%s:2222" % addresses["th1"]],
                                 "worker": ["%s:2222" % addresses["th2"],
                                            "%s:2222" % addresses["th3"]]}
    assert {m["hostname"] for m in record["machines"]} == {"th1", "th2", "th3"}
    assert {m["python"] for m in record["machines"]} == {ROOT + "/venv/bin/python"}
    assert record["tasks"]["ps:0"]["state"] == "stopped"
    for label in ("worker:0", "worker:1"):
        assert record["tasks"][label]["state"] == "succeeded"
        result = record["results"][label]
        assert result["loss"] < 0.5 * max(r["initial_loss"] for r in record["results"].values())
    for name in ("ps-0", "worker-0", "worker-1"):
        assert os.path.getsize(os.path.join(runs_dir, record["id"], name + ".log")) > 0
    # Prefixed live output names each task's host.
    assert "[worker:1 %s] " % addresses["th3"] in proc.stdout
    for name, _ in hosts.hosts:
        left = hosts.ssh(name, "pgrep -f '[t]rainers.mnist_replica' || true").stdout.strip()
        assert not left, "%s still runs %s" % (name, left)




def test_teardown_removes_everything(deployed):
    hosts, ansible, _ = deployed
    teardown = ansible.run("teardown.yml", "-e", "common_remove_user=true", label="teardown")
    assert teardown.returncode == 0, explain(teardown)
    for name, _ in hosts.hosts:
        out = hosts.ssh(name, "test ! -e %s && test ! -e /etc/ansible/facts.d/gpus.fact "
                                  "&& ! getent passwd tfcluster" % ROOT)
        assert out.returncode == 0, "%s still has tfcluster files or user" % name
        fence = subprocess.run(hosts.netns_argv(name) + ["nft", "list", "table", "inet",
                                                         "tfcluster"], capture_output=True)
        assert fence.returncode != 0, "%s: teardown left the firewall's table" % name
    assert not os.path.exists("/etc/tfcluster-firewall.nft")
    ansible.torn_down = True
