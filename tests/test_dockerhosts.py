"""scripts/dockerhosts: 3 Docker containers, each a bare Debian 12, provisioned and used for real.

The session fixture `dockerhosts` runs `scripts/dockerhosts up 3` (a private Docker engine; the
debootstrap base image comes from /var/cache/tfcluster after the first run) and ALWAYS runs
`down` at the end. Tests run in file order: first offline deploy, second deploy changed=0,
mnist_replica across the containers, stop.yml + teardown.yml leave the packages, users and groups
as the deploy found them, and last `down` after the engine was killed leaves nothing (no
container, network, engine process, mount, cgroup, bridge or file; firewall as found).
The first two tests need neither root nor Docker: the committed compose files and what
dockerhosts builds must describe the same hosts.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from conftest import pid_alive, run_record, tfcluster, wait_for  # noqa: E402

SCRIPT = os.path.join(REPO, "scripts", "dockerhosts")
ROOT = "/opt/tfcluster"


def load_dockerhosts():
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("_dockerhosts_script", SCRIPT)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    return mod


dh = load_dockerhosts()


def script(*args, timeout=900):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], cwd=REPO,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def firewall_and_sysctls():
    """What the engine must leave as it found it."""
    out = {}
    for name, argv in (("iptables", ["iptables", "-S"]), ("ip6tables", ["ip6tables", "-S"]),
                       ("nft", ["nft", "list", "ruleset"])):
        if shutil.which(name):
            out[name] = subprocess.run(argv, capture_output=True, text=True).stdout
    out["ip_forward"] = open("/proc/sys/net/ipv4/ip_forward").read()
    out["etc_docker"] = sorted(os.listdir("/etc/docker")) if os.path.isdir("/etc/docker") else None
    return out


# ---------------------------------------------------------------- static (no root needed)

def test_committed_inventory_is_what_up_3_writes():
    with open(dh.INVENTORY) as handle:
        assert handle.read() == dh.inventory_text(3)
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    im = InventoryManager(loader=DataLoader(), sources=[str(dh.INVENTORY)])
    assert [h.name for h in im.groups["ps"].get_hosts()] == ["ps1"]
    assert [h.name for h in im.groups["worker"].get_hosts()] == ["worker1", "worker2"]
    for i, name in enumerate(("ps1", "worker1", "worker2"), start=1):
        host = im.get_host(name)
        assert host.vars["ansible_host"] == host.vars["tfcluster_address"] == dh.host_addr(i)
    assert "accept-new" not in dh.inventory_text(3)


def test_compose_file_describes_the_hosts_dockerhosts_starts():
    with open(os.path.join(dh.COMPOSE_DIR, "docker-compose.yml")) as handle:
        doc = yaml.safe_load(handle)
    net = doc["networks"]["tfcluster"]
    assert net["internal"] is True
    assert net["ipam"]["config"] == [{"subnet": str(dh.SUBNET), "gateway": dh.GATEWAY}]
    assert net["driver_opts"]["com.docker.network.bridge.name"] == dh.BRIDGE
    assert set(doc["services"]) == {dh.host_name(i) for i in (1, 2, 3)}
    for i in (1, 2, 3):
        svc = doc["services"][dh.host_name(i)]
        assert svc["hostname"] == dh.host_name(i)
        assert svc["networks"]["tfcluster"]["ipv4_address"] == dh.host_addr(i)
        assert svc["image"] == dh.IMAGE and svc["build"] == "." and svc["init"] is True
        assert svc["volumes"] == ["./keys:/keys:ro"] and svc["cap_add"] == ["NET_ADMIN"]
        assert "ports" not in svc
    dockerfile = open(os.path.join(dh.COMPOSE_DIR, "Dockerfile")).read()
    assert "ARG BASE_IMAGE=debian:12" in dockerfile and "tfcluster-sshd" in dockerfile
    assert {"openssh-server", "python3", "python3-venv", "pciutils"} <= set(dh.PACKAGES)


# ---------------------------------------------------------------- on containers

class Hosts:
    names = [dh.host_name(i) for i in (1, 2, 3)]

    def __init__(self):
        self.before = {}
        dh.th.TOOL.update(dh.th.find_tools()[0])  # ssh and friends, as the script's main finds them

    def ssh(self, name, command, timeout=60, stdin=subprocess.DEVNULL):
        i = self.names.index(name) + 1
        return subprocess.run(dh.th.ssh_base(dh.KEY, dh.KNOWN_HOSTS)
                              + ["root@" + dh.host_addr(i), command], stdin=stdin,
                              capture_output=True, text=True, timeout=timeout)

    def prepare(self, work):
        """What an admin does to a bare Debian before deploy.yml can run there: install
        python3-packaging, which Ansible's pip module (roles/tensorflow) needs and no role
        installs yet. The containers reach no mirror: the .deb comes from the controller."""
        got = subprocess.run(["apt-get", "download", "python3-packaging"], cwd=work,
                             capture_output=True, text=True, timeout=300)
        debs = [f for f in os.listdir(work) if f.startswith("python3-packaging_")]
        assert debs, "apt-get download python3-packaging failed: " + got.stderr[-500:]
        for name in self.names:
            with open(os.path.join(work, debs[0]), "rb") as deb:
                out = self.ssh(name, "cat > /tmp/p.deb && dpkg -i /tmp/p.deb && rm /tmp/p.deb",
                               stdin=deb)
            assert out.returncode == 0, "%s: %s" % (name, out.stderr)

    def inventory_of(self, name):
        """Packages, users, groups and what lies in /opt and /etc/ansible of a container."""
        out = self.ssh(name, "dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n'; "
                             "echo --; getent passwd; echo --; getent group; echo --; "
                             "find /opt /etc/ansible 2>/dev/null | sort")
        assert out.returncode == 0, out.stderr
        return out.stdout


@pytest.fixture(scope="session")
def dockerhosts(request):
    if os.geteuid() != 0:
        pytest.skip("dockerhosts needs root: it runs a Docker engine")
    missing = [t for t in ("docker", "dockerd", "containerd") if not shutil.which(
        t, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")]
    if missing:
        pytest.skip("dockerhosts needs %s: apt-get install docker.io debootstrap (make test "
                    "does)" % ", ".join(missing))
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    hosts = Hosts()
    hosts.timings = []
    hosts.found = firewall_and_sysctls()
    script("down", timeout=300)  # leftovers of a crashed session
    started = time.monotonic()
    up = script("up", 3)
    hosts.timings.append(("dockerhosts up 3", time.monotonic() - started))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield hosts
    finally:
        started = time.monotonic()
        down = script("down", timeout=300)
        hosts.timings.append(("dockerhosts down (finalizer)", time.monotonic() - started))
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            reporter.write_line("\ntest_dockerhosts timings (s):\n" + "\n".join(
                "  %-32s %6.1f" % pair for pair in hosts.timings))
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.fixture(scope="session")
def deployed(dockerhosts, tmp_path_factory):
    """The containers after a first offline deploy: (hosts, Ansible runner, first run)."""
    from test_deploy import Ansible, explain, tiny_dataset
    work = str(tmp_path_factory.mktemp("dockerdeploy"))
    hosts = dockerhosts
    hosts.prepare(work)
    for name in hosts.names:
        hosts.before[name] = hosts.inventory_of(name)
    started = time.monotonic()
    wheelhouse = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "wheelhouse")],
                                cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert wheelhouse.returncode == 0, wheelhouse.stdout[-3000:] + wheelhouse.stderr[-3000:]
    hosts.timings.append(("scripts/wheelhouse", time.monotonic() - started))
    # The deployed code is a snapshot: other edits of trainers/ cannot change it mid-test.
    trainers = os.path.join(work, "trainers")
    shutil.copytree(os.path.join(REPO, "trainers"), trainers, symlinks=True)
    manifest, cache = tiny_dataset(os.path.join(work, "data"))
    # Only the cached files: its mirror is a file:// path on this machine, not in a container.
    with open(manifest) as handle:
        sets = json.load(handle)
    sets["tiny"]["files"] = [f for f in sets["tiny"]["files"]
                             if os.path.exists(os.path.join(cache, "tiny", f["name"]))]
    with open(manifest, "w") as handle:
        json.dump(sets, handle)
    extra = os.path.join(work, "extra-vars.json")
    with open(extra, "w") as handle:
        json.dump({"tensorflow_pip_compile": False, "trainers_src": trainers,
                   "datasets_names": ["tiny"], "datasets_manifest": manifest,
                   "datasets_cache_dir": cache}, handle)
    ansible = Ansible(dh.INVENTORY, extra, work)
    ansible.explain = explain
    try:
        first = ansible.run("deploy.yml", "-e", "tensorflow_install_mode=offline",
                            label="first deploy")
        assert first.returncode == 0, explain(first)
        yield hosts, ansible, first
    finally:
        ansible.close()
        hosts.timings += ansible.timings


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.docker
def test_first_deploy_provisions_bare_containers(deployed):
    hosts, _, first = deployed
    for name in hosts.names:
        assert first.recap[name]["failed"] == 0 and first.recap[name]["changed"] > 0
        out = hosts.ssh(name, "getent group tfcluster && getent passwd tfcluster && "
                              "stat -c %%a %s/work && cat %s/data/tiny/tiny-batches/inner.txt && "
                              "TF_CPP_MIN_LOG_LEVEL=3 %s/venv/bin/python -c "
                              "'import tensorflow as tf; print(tf.__version__)'"
                        % (ROOT, ROOT, ROOT))
        assert out.returncode == 0, "%s: %s" % (name, out.stderr[-2000:])
        lines = out.stdout.split("\n")
        assert lines[2:5] == ["3775", "inside the archive", "2.21.0"], out.stdout
        # Deploy created the service user and group: the bare container had neither.
        assert "tfcluster:" not in hosts.before[name]


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.docker
def test_second_deploy_changes_nothing(deployed):
    hosts, ansible, _ = deployed
    second = ansible.run("deploy.yml", "-e", "tensorflow_install_mode=offline",
                         label="second deploy")
    assert second.returncode == 0, ansible.explain(second)
    for name in hosts.names:
        assert second.recap[name]["changed"] == 0, ansible.explain(second)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.docker
def test_launch_trains_across_the_containers(deployed, tmp_path):
    hosts, _, _ = deployed
    runs_dir = str(tmp_path / "runs")
    started = time.monotonic()
    proc = tfcluster("launch", "mnist_replica", "-i", str(dh.INVENTORY), "--smoke",
                     "--timeout", "300", runs_dir=runs_dir, timeout=420)
    hosts.timings.append(("launch mnist_replica --smoke", time.monotonic() - started))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    record = run_record(runs_dir)
    assert record["cluster"] == {"ps": ["10.232.0.11:2222"],
                                 "worker": ["10.232.0.12:2222", "10.232.0.13:2222"]}
    assert {m["hostname"] for m in record["machines"]} == set(hosts.names)
    assert record["tasks"]["ps:0"]["state"] == "stopped"
    for label in ("worker:0", "worker:1"):
        assert record["tasks"][label]["state"] == "succeeded"
        result = record["results"][label]
        assert result["loss"] < 0.5 * max(r["initial_loss"] for r in record["results"].values())
    for name in hosts.names:  # no procps in a bare container: read /proc
        left = hosts.ssh(name, "grep -l mnist_replica /proc/[0-9]*/cmdline 2>/dev/null || true")
        assert not left.stdout.strip(), "%s still runs %s" % (name, left.stdout)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.docker
def test_stop_and_teardown_leave_the_containers_as_found(deployed):
    hosts, ansible, _ = deployed
    stop = ansible.run("stop.yml", label="stop")
    assert stop.returncode == 0, ansible.explain(stop)
    teardown = ansible.run("teardown.yml", "-e", "common_remove_user=true", label="teardown")
    assert teardown.returncode == 0, ansible.explain(teardown)
    for name in hosts.names:
        assert hosts.inventory_of(name) == hosts.before[name], name


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.docker
def test_down_after_the_engine_died_leaves_nothing(dockerhosts):
    hosts = dockerhosts
    state = json.load(open(dh.STATE_JSON))
    engine = state["engine_pid"]
    assert pid_alive(engine)
    # A crash: the engine dies, its containers run on (containerd shims).
    os.kill(engine, signal.SIGKILL)
    wait_for(lambda: not pid_alive(engine), 10, "dockerd killed")
    assert hosts.ssh("ps1", "hostname").stdout.strip() == "ps1"
    started = time.monotonic()
    down = script("down", timeout=300)
    hosts.timings.append(("dockerhosts down (engine killed)", time.monotonic() - started))
    assert down.returncode == 0, down.stdout + down.stderr
    assert dh.leftovers() == []
    assert not os.path.exists(dh.STATE) and not os.path.exists(dh.KNOWN_HOSTS)
    assert not any(p.name.startswith(".build-") for p in dh.CACHE.iterdir())
    assert not os.path.exists("/sys/class/net/" + dh.BRIDGE)
    assert not dh.th.tcp_open(dh.host_addr(1), 22, 0.5)
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            cmd = dh.th.proc_cmdline(pid)
            assert ".work/dockerhosts" not in cmd, cmd
    assert firewall_and_sysctls() == hosts.found
    diff = subprocess.run(["git", "diff", "--quiet", "--", "inventory/compose.yml"], cwd=REPO)
    assert diff.returncode == 0, "down did not put back the committed inventory/compose.yml"
    again = script("down", timeout=120)
    assert again.returncode == 0 and "nothing left" in again.stdout, again.stderr
