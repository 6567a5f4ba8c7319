"""deploy.yml, stop.yml and teardown.yml on 3 Docker containers, each a bare Debian 12.

The session fixture `dockerhosts` runs `scripts/dockerhosts up 3` (a private Docker engine; the
debootstrap base image comes from /var/cache/tfcluster after the first run) and ALWAYS runs
`down` at the end. Tests run in file order. First the README's Install lines (the session
fixture `readme_run`), from the installed wheel in an empty folder: init, wheelhouse, a dry run,
deploy, mnist_replica across the containers through the fence. That is the one deploy from bare
containers: the fixture `deployed` then makes the checkout's wheelhouse (found made: the README's
is shared with it) and deploys offline from the checkout over it (the containers reach no package
index) with the test's data set and a snapshot of the code; against that: what the deploys put
there (venv unpacked from the pack, TensorFlow, data, fence), a second deploy changes nothing, a
--check run of the GPU path, the trainer code hash, stop.yml stops what a detached launch left,
teardown.yml leaves the packages, users, groups and files as the bare containers were, and last
`down` after the engine was killed leaves nothing (no container, network, engine process, mount,
cgroup, bridge or file; firewall as found).
The first two tests need neither root nor Docker: the committed compose files and what
dockerhosts builds must describe the same hosts.
"""
import compileall
import json
import os
import pathlib
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import yaml

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from support.ansible_run import (RECAP, Ansible, ansible_tool, close_ssh_masters, explain,  # noqa: E402
                         task_status_runs, task_statuses, tiny_dataset)
from support.installed_wheel import build_wheel, install_wheel, run_installed  # noqa: E402
from support.cli import assert_pictures_drawn, run_record, tfcluster
from support.locks import DOCKERHOSTS_LOCK, hold_lock, ready_wheelhouse, share_wheelhouse
from support.procs import pid_alive, wait_for
from support import readme_install  # noqa: E402
from hostlib import dockerhosts as dh  # noqa: E402
from hostlib import engine as dockerd  # noqa: E402
from hostlib import image  # noqa: E402
from hostlib.common import proc_cmdline  # noqa: E402
from hostlib.ssh import ssh_base  # noqa: E402
from tfcluster.deploy.wheelhouse import PACK_CACHE_ENV  # noqa: E402

SCRIPT = os.path.join(REPO, "scripts", "dockerhosts")
ROOT = "/opt/tfcluster"
TF_VERSION = "2.21.0"


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

def inventory_vars(path):
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    im = InventoryManager(loader=DataLoader(), sources=[str(path)])
    assert [h.name for h in im.groups["ps"].get_hosts()] == ["ps1"]
    assert [h.name for h in im.groups["worker"].get_hosts()] == ["worker1", "worker2"]
    for i, name in enumerate(("ps1", "worker1", "worker2"), start=1):
        host = im.get_host(name)
        assert host.vars["ansible_host"] == host.vars["tfcluster_address"] == dh.host_addr(i)
    return im.groups["all"].get_vars()


def test_committed_inventory_is_the_3_hosts_up_3_writes(tmp_path):
    """The committed inventory (docker compose users, from the repository root) and what `up 3`
    writes (absolute paths: any folder) name the same hosts and the same key files."""
    with open(dh.COMMITTED_INVENTORY) as handle:
        assert handle.read() == dh.inventory_text(3, dh.committed_keys())
    written = tmp_path / "compose.yml"
    written.write_text(dh.inventory_text(3))
    committed, absolute = inventory_vars(dh.COMMITTED_INVENTORY), inventory_vars(written)
    assert absolute["ansible_ssh_private_key_file"] == str(dh.KEY)
    assert absolute["tfcluster_known_hosts"] == str(dh.KNOWN_HOSTS)
    assert committed["ansible_ssh_private_key_file"] == "deploy/compose/keys/id_ed25519"
    assert {k: v.replace(str(dh.REPO) + "/", "") for k, v in absolute.items()} == committed
    assert "accept-new" not in dh.inventory_text(3)


def test_compose_file_describes_the_hosts_dockerhosts_starts():
    with open(os.path.join(image.COMPOSE_DIR, "docker-compose.yml")) as handle:
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
        assert svc["image"] == image.IMAGE and svc["build"] == "." and svc["init"] is True
        assert svc["volumes"] == ["./keys:/keys:ro"] and svc["cap_add"] == ["NET_ADMIN"]
        assert "ports" not in svc
    dockerfile = open(os.path.join(image.COMPOSE_DIR, "Dockerfile")).read()
    assert "ARG BASE_IMAGE=debian:12" in dockerfile and "tfcluster-sshd" in dockerfile
    # The containers reach no mirror: the image holds every package deploy.yml's roles install.
    with open(os.path.join(REPO, "roles", "common", "defaults", "main.yml")) as handle:
        common = yaml.safe_load(handle)["common_packages"]
    assert {"openssh-server", "nftables", *common} <= set(image.packages())


# ---------------------------------------------------------------- on containers

def on_containers(test):
    """Marks a test that needs root and a Docker engine (tests run in file order). The first
    one's setup brings the containers up (building the base image with debootstrap when the
    cache lacks it) and deploys: up to 15 minutes on a busy 2-core machine."""
    return pytest.mark.timeout(1800)(pytest.mark.root(pytest.mark.slow(pytest.mark.docker(test))))


class Hosts:
    names = [dh.host_name(i) for i in (1, 2, 3)]

    def __init__(self):
        self.before = {}

    def ssh(self, name, command, timeout=60, stdin=subprocess.DEVNULL):
        i = self.names.index(name) + 1
        return subprocess.run(ssh_base(dh.KEY, dh.KNOWN_HOSTS)
                              + ["root@" + dh.host_addr(i), command], stdin=stdin,
                              capture_output=True, text=True, timeout=timeout)

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
    # The containers are the machine's: one session (or scripts/bench) at a time.
    lock = hold_lock(DOCKERHOSTS_LOCK, timeout=1800)
    request.addfinalizer(lambda: os.close(lock))
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
def deployed(dockerhosts, readme_run, tmp_path_factory, request):
    """The containers the README's lines deployed (the first deploy, from bare), deployed again
    offline from the checkout with the test's inputs (a data set, a snapshot of the code):
    (hosts, Ansible runner, that deploy's run)."""
    work = str(tmp_path_factory.mktemp("dockerdeploy"))
    hosts = dockerhosts
    started = time.monotonic()
    wheelhouse = ready_wheelhouse()
    assert wheelhouse.returncode == 0, wheelhouse.stdout[-3000:] + wheelhouse.stderr[-3000:]
    hosts.timings.append(("tfcluster wheelhouse (and its pack)", time.monotonic() - started))
    # The hosts' Python is the controller's /usr/bin/python3 (both Debian 12): the README's
    # deploy unpacked the packed venv instead of running pip, and this one finds it so.
    assert os.path.isfile(os.path.join(REPO, "wheelhouse", "venv-pack.json")), wheelhouse.stdout[-3000:]
    # The deployed code is a snapshot: other edits of trainers/ cannot change it mid-test.
    trainers = os.path.join(work, "code")
    for package in ("tfcluster_agent", "trainers"):
        shutil.copytree(os.path.join(REPO, package), os.path.join(trainers, package),
                        symlinks=True)
    # Compiled files beside it that the deploy must not ship (test_trainer_code_hash_matches).
    assert compileall.compile_dir(trainers, quiet=1)
    # The README's launch left compiled files of its own on the hosts (the trainers' Python wrote
    # them): without the code there, this deploy ships the snapshot again from the start.
    for name in hosts.names:
        gone = hosts.ssh(name, "rm -r {0}/trainers {0}/tfcluster_agent {0}/trainers.sha256"
                         .format(ROOT))
        assert gone.returncode == 0, (name, gone.stderr)
    # A mirror the containers download from: an HTTP server on the bridge's gateway address.
    os.makedirs(os.path.join(work, "data", "mirror"))
    mirror = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", dh.GATEWAY,
                               "--directory", os.path.join(work, "data", "mirror"), "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    request.addfinalizer(lambda: (mirror.kill(), mirror.wait()))
    ready, _, _ = select.select([mirror.stdout], [], [], 30)
    assert ready, "the test mirror (python -m http.server) did not start within 30 s"
    port = re.search(r"port (\d+)", mirror.stdout.readline()).group(1)
    hosts.mirror = "http://%s:%s" % (dh.GATEWAY, port)
    manifest, cache = tiny_dataset(os.path.join(work, "data"), hosts.mirror)
    extra = os.path.join(work, "extra-vars.json")
    with open(extra, "w") as handle:
        # No byte-compiling should pip run (a host the pack does not match): about 70 s less for
        # three installs sharing two cores. The pack the hosts get is byte-compiled.
        json.dump({"tensorflow_pip_compile": False, "trainers_src": trainers,
                   "datasets_names": ["tiny"], "datasets_manifest": manifest,
                   "datasets_cache_dir": cache}, handle)
    ansible = Ansible(dh.INVENTORY, extra, work)
    try:
        first = ansible.run("deploy.yml", "-e", "tensorflow_install_mode=offline",
                            label="deploy over the README's")
        assert first.returncode == 0, explain(first)
        yield hosts, ansible, first
    finally:
        ansible.close()
        hosts.timings += ansible.timings


@on_containers
def test_the_inventory_up_writes_works_from_any_folder(dockerhosts, tmp_path):
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_SSH_ARGS="-o ControlMaster=no")
    r = subprocess.run([ansible_tool("ansible"), "all", "-i", str(dh.INVENTORY), "-m", "raw",
                        "-a", "hostname"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in dockerhosts.names:
        assert "%s | CHANGED | rc=0 >>\n%s" % (name, name) in r.stdout, r.stdout


# The README's inventory (tfcluster init) names the containers ps1, worker1, worker2 thus.
README_NAMES = {"ps1": "ps0", "worker1": "worker0", "worker2": "worker1"}


@pytest.fixture(scope="session")
def readme_run(dockerhosts, tmp_path_factory, request):
    """README.md's Install lines, read from it, as a user types them: in an empty folder outside
    the checkout, with a venv that has the wheel installed (tests/installed_wheel.py), on the bare
    containers (their addresses for the README's host names, dockerhosts' key and known_hosts for
    ~/.ssh's). Then a plain ansible-playbook of the same playbook. The containers stay deployed:
    the deploy tests below build on this first deploy instead of making a second one from bare
    (the README's deploy is the one from bare that they check), and the last of them tears down.
    The wheelhouse is shared with the checkout's, which the deploy tests then find made."""
    hosts = dockerhosts
    tmp_path = tmp_path_factory.mktemp("readme")
    run = Readme()
    # What the containers were before any deploy: the teardown test compares with it.
    for name in hosts.names:
        hosts.before[name] = hosts.inventory_of(name)
    run.python, _, _ = install_wheel(build_wheel(str(tmp_path)), str(tmp_path / "installed"))
    # ~ in the README's lines. A short path, as a home is: the packed venv is built under
    # ~/mycluster/wheelhouse, and pip gives scripts whose interpreter's path would be longer
    # than a #! line allows a /bin/sh preamble instead (the deploy tests below check the #!).
    home = pathlib.Path(tempfile.mkdtemp(prefix="tfc-readme-"))
    request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
    (home / ".ssh").mkdir(parents=True)
    os.symlink(os.path.dirname(os.path.dirname(run.python)), home / "tfc")
    shutil.copy(dh.KEY, home / ".ssh" / "id_ed25519")
    shutil.copy(dh.KNOWN_HOSTS, home / ".ssh" / "known_hosts")
    run.tmp = tmp_path / "tmp"
    run.tmp.mkdir()
    lines = readme_install.substitute(readme_install.install_lines(), {
        "~/": "%s/" % home, "ps1.example.com": dh.host_addr(1),
        "gpu1.example.com": dh.host_addr(2), "gpu2.example.com": dh.host_addr(3)})
    run.cluster = home / "mycluster"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    # TMPDIR: where a controller-side temporary archive would be left.
    env.update(ANSIBLE_NOCOLOR="1", PYTHONPATH="", TMPDIR=str(run.tmp),
               ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp_path / "cp"))
    request.addfinalizer(lambda: close_ssh_masters(str(tmp_path / "cp")))
    if not readme_install.pack_cache_unused(env.get(PACK_CACHE_ENV)):
        # Another session of this make test packed first: from nothing all the same.
        env[PACK_CACHE_ENV] = str(tmp_path / "packs")
    run.code, run.ran = readme_install.run_lines(lines, str(home), env, timeout=1500)
    hosts.timings += [("README: " + line.split("/bin/")[-1][:40], seconds)
                      for line, seconds, _, _ in run.ran]
    run.complete = run.code == 0 and len(run.ran) == len(lines)
    run.outputs = {line.split("/bin/")[-1]: out for line, _, out, _ in run.ran}
    if run.complete:
        # Plain Ansible, the same playbook: the stamps tfcluster deploy wrote hold.
        started = time.monotonic()
        run.plain = run_installed(run.python, str(run.cluster), "-m", "ansible", "playbook",
                                  "tfcluster.cluster.deploy", "-i", "hosts.yml", timeout=600,
                                  env=env)
        hosts.timings.append(("README: plain ansible-playbook again", time.monotonic() - started))
    close_ssh_masters(str(tmp_path / "cp"))
    assert_pictures_drawn(str(run.cluster / "runs"))
    if os.path.isdir(run.cluster / "wheelhouse"):
        share_wheelhouse(str(run.cluster / "wheelhouse"))
    return run


class Readme:
    """What readme_run ran: .ran [(line, seconds, stdout, stderr)], .outputs {line: stdout}."""
    plain = None

    def deploy_statuses(self):
        """{(task, container name): status} of the README's deploy, the first on bare hosts."""
        names = {readme: name for name, readme in README_NAMES.items()}
        out = self.outputs["tfcluster deploy -i hosts.yml"]
        return {(task.replace("tfcluster.cluster.", ""), names.get(host, host)): statuses
                for (task, host), statuses in task_status_runs(out).items()}


@on_containers
def test_the_readme_install_lines_run_on_bare_containers(dockerhosts, readme_run):
    """init, wheelhouse (downloaded and packed from nothing), a dry run on hosts never deployed
    (exit 0), the deploy (the wheel's collection), then mnist_replica across the containers
    through the fence: nothing of it prints a traceback, leaves a temporary archive or a task
    running. A plain ansible-playbook of the same playbook then takes the stamp's fast path.
    (test_teardown_leaves_the_containers_as_found tears down what this deploy and the deploy
    tests' left.)"""
    run = readme_run
    assert run.complete, "README line failed: %s\n%s\n%s" % (
        run.ran[-1][0], run.ran[-1][2][-4000:], run.ran[-1][3][-3000:])
    for line, _, out, err in run.ran:
        assert "Traceback" not in err and "Exception ignored" not in err, (line, err[-3000:])
    # Made from nothing: downloaded and packed here, not found made nor linked from a cache.
    wheelhouse = run.outputs["tfcluster wheelhouse"]
    assert "is up to date" not in wheelhouse and "from the pack cache" not in wheelhouse, wheelhouse
    assert re.search(r"^wheelhouse: packed environment \S+, \d+ MB", wheelhouse, re.M), wheelhouse
    for key in ("tfcluster deploy -i hosts.yml --check --diff", "tfcluster deploy -i hosts.yml"):
        out = run.outputs[key]
        assert "tfcluster: ansible-playbook tfcluster.cluster.deploy -i hosts.yml" in out, out
        recap = {m.group(1): m.groups()[1:] for m in RECAP.finditer(out)}
        for name in README_NAMES.values():
            ok, changed, unreachable, failed = map(int, recap[name][:4])
            assert changed > 0 and unreachable == failed == 0, (key, out[-4000:])
    assert os.listdir(run.tmp) == [], "left in the controller's temp folder"
    assert_trained_across_the_containers(dockerhosts, str(run.cluster / "runs"),
                                         run.outputs["tfcluster launch mnist_replica -i hosts.yml "
                                                     "--smoke"])
    plain = run.plain
    assert plain.returncode == 0, plain.stdout[-4000:] + plain.stderr[-2000:]
    assert set(stamp_report(plain).values()) == {FAST}, plain.stdout[-4000:]


def assert_trained_across_the_containers(hosts, runs_dir, output):
    """The ps on ps1 served workers on worker1 and worker2 through the fence, all from the
    deployed venv and code, and nothing of the run is left on the containers."""
    record = run_record(runs_dir)
    assert record["cluster"] == {"ps": ["10.232.0.11:2222"],
                                 "worker": ["10.232.0.12:2222", "10.232.0.13:2222"]}
    assert {m["hostname"] for m in record["machines"]} == set(hosts.names)
    assert {m["python"] for m in record["machines"]} == {ROOT + "/venv/bin/python"}
    assert record["tasks"]["ps:0"]["state"] == "stopped"
    for label in ("worker:0", "worker:1"):
        assert record["tasks"][label]["state"] == "succeeded"
        result = record["results"][label]
        assert result["loss"] < 0.5 * max(r["initial_loss"] for r in record["results"].values())
    for name in ("ps-0", "worker-0", "worker-1"):
        assert os.path.getsize(os.path.join(runs_dir, record["id"], name + ".log")) > 0
    # Prefixed live output names each task's host.
    assert "[worker:1 10.232.0.13] " in output
    for name in hosts.names:  # no procps in a bare container: read /proc ([m]: not this grep)
        left = hosts.ssh(name, "grep -l '[m]nist_replica' /proc/[0-9]*/cmdline 2>/dev/null || true")
        assert not left.stdout.strip(), "%s still runs %s" % (name, left.stdout)


@on_containers
def test_first_deploy_provisions_bare_containers(deployed):
    """The README's deploy provisioned the bare containers (its recap: the README test); the
    checkout's deploy over it added the test's data set. What both left is there: TensorFlow
    and tf-keras import from the venv (one interpreter a host)."""
    hosts, _, over = deployed
    for name in hosts.names:
        assert over.recap[name]["failed"] == 0 and over.recap[name]["unreachable"] == 0
        assert over.recap[name]["changed"] > 0, "%s: a new data set and nothing changed" % name
        out = hosts.ssh(name, "getent group tfcluster && getent passwd tfcluster && "
                              "stat -c %%a %s/work && cat %s/data/tiny/tiny.txt "
                              "%s/data/tiny/tiny-batches/inner.txt %s/data/tiny/remote.txt && "
                              "nft list table inet tfcluster"
                              " >/dev/null && TF_CPP_MIN_LOG_LEVEL=3 %s/venv/bin/python -c "
                              "'import tensorflow as tf, tf_keras; print(tf.__version__, "
                              "len(tf.config.list_physical_devices(\"GPU\")), tf_keras.__version__)'"
                        % (ROOT, ROOT, ROOT, ROOT, ROOT),
                        # The first import from the venv just unpacked (files not cached yet),
                        # beside the other sessions' training: over 60 s once in a full run.
                        timeout=300)
        assert out.returncode == 0, "%s: %s" % (name, out.stderr[-2000:])
        lines = out.stdout.split("\n")
        assert lines[2:7] == ["3775", "tiny data set", "inside the archive",
                              "downloaded from the second mirror",
                              "%s 0 %s" % (TF_VERSION, TF_VERSION)], out.stdout
        # Deploy created the service user and group: the bare container had neither.
        assert "tfcluster:" not in hosts.before[name]


def stamp_report(proc):
    """{machine: what deploy.yml's stamp check decided}, from its report task."""
    text = proc.stdout.split("TASK [Report which machines are provisioned]", 1)[1]
    return dict(re.findall(r'^\s+"(\S+): (.*?)",?$', text.split("\nPLAY ", 1)[0], re.M))


FAST = "as its deploy stamp says, not provisioned again"
STAMP = ROOT + "/.deploy-stamp-%s.json"  # one per machine: machines may share their root


def assert_unchanged(hosts, proc, names):
    for name in names:
        assert proc.recap[name]["changed"] == 0, "%s changed on a deploy:\n%s" % (
            name, "\n".join(line for line in proc.stdout.splitlines()
                            if line.startswith("changed:")) or explain(proc))


def assert_fast_path(hosts, proc):
    """Every machine skipped the provisioning play and was verified."""
    assert stamp_report(proc) == {name: FAST for name in hosts.names}, explain(proc)
    provision = proc.stdout.split("PLAY [Provision each tfcluster machine once]", 1)[1]
    assert provision.lstrip("* \n").startswith("skipping: no hosts matched"), explain(proc)
    statuses = task_statuses(proc.stdout)
    for name in hosts.names:
        assert statuses[("Ensure TensorFlow and the trainer code are as deployed", name)] == "ok"


@on_containers
def test_first_deploy_unpacked_the_packed_venv(deployed, readme_run):
    """The venv came from `tfcluster wheelhouse`'s pack (unpacked in the background, waited for before
    the stamp) on the README's deploy, the first on the bare containers: no wheelhouse, no pip;
    its scripts name the host's venv, nothing is left of the unpacking, not even
    Ansible's record of the job. (Whether the checkout's deploy over it pushes the pack again
    depends on the checkout's wheelhouse, which the other test session may build meanwhile.)"""
    hosts, _, _ = deployed
    runs = readme_run.deploy_statuses()
    statuses = {key: found[0] for key, found in runs.items()}
    for name in hosts.names:
        assert statuses.get(("tensorflow : Ensure the packed environment is unpacked into the venv",
                             name)) == "changed", runs
        # Skipped in the role (tensorflow_unpack_wait: false), waited for after the datasets role.
        assert runs.get(("tensorflow : Ensure the packed environment's unpack has finished",
                         name)) == ["skipping", "ok"], runs
        assert statuses.get(("tensorflow : Ensure the packages are installed in the venv", name)) in (
            None, "skipping"), runs
        out = hosts.ssh(name, "cd {0} && ls -A; echo --; head -qn1 venv/bin/pip venv/bin/tflite_convert"
                              "; echo --; grep -l venv-pack venv/bin/* venv/pyvenv.cfg; echo --; "
                              "grep -o '\"pack\": \"[0-9a-f]*\"' venv/tfcluster-installed; echo --; "
                              "venv/bin/pip --version; echo --; "
                              "ls -A /root/.ansible_async 2>/dev/null; true".format(ROOT))
        assert out.returncode == 0, "%s: %s %s" % (name, out.stdout, out.stderr[-2000:])
        entries, shebangs, unrewritten, record, tools, jobs = [
            part.split() for part in out.stdout.split("--\n")]
        assert jobs == [], jobs
        # No wheelhouse was pushed; no venv.new, venv.old or pushed archive is left.
        assert "wheelhouse" not in entries and "venv" in entries, entries
        assert not [e for e in entries if e.startswith("venv.")], entries
        assert shebangs == ["#!%s/venv/bin/python3" % ROOT, "#!%s/venv/bin/python" % ROOT], shebangs
        assert unrewritten == [] and len(record) == 2, (unrewritten, record)
        assert "%s/venv/lib/python3.11/site-packages/pip" % ROOT in tools, tools


@on_containers
def test_second_deploy_changes_nothing(deployed):
    hosts, ansible, _ = deployed
    second = ansible.run("deploy.yml", "-e", "tensorflow_install_mode=offline",
                         label="second deploy")
    assert second.returncode == 0, explain(second)
    assert_unchanged(hosts, second, hosts.names)
    # The first deploy left a stamp on each machine: nothing changed, so nothing is provisioned.
    assert_fast_path(hosts, second)
    for name in hosts.names:
        mode = hosts.ssh(name, "stat -c '%%a %%U' %s" % (STAMP % name))
        assert mode.stdout.split() == ["600", "root"], (name, mode.stdout, mode.stderr)


@on_containers
def test_drift_on_one_machine_is_repaired_there_only(deployed):
    hosts, ansible, _ = deployed
    # What a user or a package upgrade might do on worker1: the fence's table flushed, its
    # ruleset file and a trainer file chmodded, a data file deleted.
    drift = ("nft delete table inet tfcluster && chmod 600 /etc/tfcluster-firewall.nft && "
             "chmod 700 {0}/trainers/common/loop.py && rm {0}/data/tiny/tiny.txt".format(ROOT))
    assert hosts.ssh("worker1", drift).returncode == 0
    repair = ansible.run("deploy.yml", "-e", "tensorflow_install_mode=offline",
                         label="deploy after a drift on worker1")
    assert repair.returncode == 0, explain(repair)
    report = stamp_report(repair)
    assert report["ps1"] == report["worker2"] == FAST, report
    assert report["worker1"].startswith("provisioned: changed since the last deploy: "), report
    for path in ("/etc/tfcluster-firewall.nft", "loop.py", "tiny.txt", "list table inet tfcluster"):
        assert path in report["worker1"], report
    assert repair.recap["worker1"]["changed"] > 0, explain(repair)
    assert_unchanged(hosts, repair, ["ps1", "worker2"])
    statuses = task_statuses(repair.stdout)
    assert ("common : Ensure the tfcluster folders exist", "ps1") not in statuses
    assert statuses[("common : Ensure the tfcluster folders exist", "worker1")] == "ok"
    fixed = hosts.ssh("worker1", "stat -c %a /etc/tfcluster-firewall.nft "
                                 "{0}/trainers/common/loop.py && "
                                 "cat {0}/data/tiny/tiny.txt && nft list table inet tfcluster "
                                 ">/dev/null".format(ROOT))
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.split("\n")[:3] == ["644", "644", "tiny data set"], fixed.stdout
    again = ansible.run("deploy.yml", "-e", "tensorflow_install_mode=offline",
                        label="deploy after the repair")
    assert again.returncode == 0, explain(again)
    assert_unchanged(hosts, again, hosts.names)
    assert_fast_path(hosts, again)


@on_containers
def test_check_mode_runs_the_gpu_roles_without_failing(deployed):
    hosts, ansible, _ = deployed
    # A stale file the next real deploy would delete: --check must report it and leave it.
    stale = "%s/trainers/stale_module.py" % ROOT
    assert hosts.ssh("worker1", "echo 'x = 1' > %s" % stale).returncode == 0
    try:
        # One host walks the whole GPU path; three would share two cores for nothing more.
        # NVIDIA's repository: the test's mirror, which lacks it. The key's download fails at
        # once (ignored in --check) where developer.download.nvidia.com's name would take 10 s
        # twice to fail to resolve (the containers have no DNS).
        check = ansible.run("deploy.yml", "--check", "--limit", "worker1",
                            "-e", "nvidia_driver_repo_base_url=%s/nvidia" % hosts.mirror,
                            "-e", "tensorflow_install_mode=offline", "-e", "tfcluster_gpu=true",
                            "-e", "nvidia_driver_skip_reboot=true", "-e", "cuda_install=true",
                            label="deploy --check, GPU forced")
        assert check.returncode == 0, explain(check)
        statuses = task_statuses(check.stdout)
        assert set(check.recap) == {"worker1"}, explain(check)
        assert check.recap["worker1"]["failed"] == 0, explain(check)
        # Other variables (-e) than the stamp's: worker1 is checked in full, its stamp kept.
        assert stamp_report(check) == {"worker1": "provisioned: the deploy's inputs changed "
                                       "(roles, playbooks, variables, trainer code or wheels)"}
        for task in ("nvidia_driver : Ensure the kernel headers of the running kernel are installed",
                     "nvidia_driver : Ensure NVIDIA's repository key is installed",
                     "nvidia_driver : Ensure NVIDIA's repository is an apt source",
                     "nvidia_driver : Ensure the NVIDIA driver packages are installed, open modules of branch 580",
                     "nvidia_driver : Decide whether a reboot must load the installed driver",
                     "nvidia_driver : Ensure nouveau is blacklisted",
                     "nvidia_driver : Check that nvidia-smi lists the GPUs",
                     "cuda : Ensure the CUDA toolkit packages are installed"):
            assert statuses.get((task, "worker1")) not in (None, "skipping"), (
                "task %r did not run in --check: %s" % (task, statuses.get((task, "worker1"))))
        assert statuses[("trainers : Ensure files no longer in the repository are gone from the host",
                         "worker1")] == "changed"
        # The dry run changed nothing: the stale file, the modprobe and apt folders as they were.
        left = hosts.ssh("worker1", "test -e %s && ! test -e /etc/modprobe.d/blacklist-nouveau.conf "
                                    "&& cd /etc/apt/sources.list.d && ! test -e nvidia-cuda.sources "
                                    "&& ! test -e tfcluster-debian-extra.sources" % stale)
        assert left.returncode == 0, "the --check run changed worker1: " + left.stdout
        assert hosts.ssh("worker1", "test -e " + STAMP % "worker1").returncode == 0, \
            "--check removed the stamp"
    finally:
        hosts.ssh("worker1", "rm -f %s" % stale)


@on_containers
def test_trainer_code_hash_matches(deployed):
    hosts, ansible, _ = deployed
    trainers = json.load(open(ansible.extra_vars_file))["trainers_src"]
    expected = subprocess.run([sys.executable, os.path.join(trainers, "tfcluster_agent", "agent.py"),
                               "hash", "--dir",
                               trainers], capture_output=True, text=True, check=True).stdout.strip()
    for name in hosts.names:
        out = hosts.ssh(name, "cat {0}/trainers.sha256; {0}/venv/bin/python "
                              "{0}/tfcluster_agent/agent.py hash --dir {0}; "
                              "find {0}/trainers {0}/tfcluster_agent -name '*.pyc' | wc -l"
                        .format(ROOT))
        assert out.returncode == 0, out.stderr
        recorded, computed, pyc = out.stdout.split()
        assert recorded == computed == expected, name
        assert pyc == "0", "%s: compiled files were shipped" % name


@on_containers
def test_stop_stops_what_a_detached_launch_left(deployed, tmp_path):
    hosts, ansible, _ = deployed
    runs_dir = str(tmp_path / "runs")
    proc = tfcluster("launch", "--cmd", "exec sleep 600", "-i", str(dh.INVENTORY), "--ps", "0",
                     "--detach", runs_dir=runs_dir, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    pids = {t["host"]: t["pid"] for t in run_record(runs_dir)["tasks"].values()}
    assert sorted(pids) == ["10.232.0.12", "10.232.0.13"] and all(pids.values())
    stop = ansible.run("stop.yml", label="stop (2 tasks running)")
    assert stop.returncode == 0, explain(stop)
    assert stop.recap["ps1"]["changed"] == 0
    assert stop.recap["worker1"]["changed"] == 1 and stop.recap["worker2"]["changed"] == 1, \
        explain(stop)
    for name, address in (("worker1", "10.232.0.12"), ("worker2", "10.232.0.13")):
        # Gone, or a zombie its supervisor has not reaped yet: the stop is done either way.
        gone = "! kill -0 {0} 2>/dev/null || grep -q '^State:.*Z' /proc/{0}/status".format(
            pids[address])
        wait_for(lambda: hosts.ssh(name, gone).returncode == 0, 30,
                 "%s: task %d to be gone" % (name, pids[address]))
    # (A second stop.yml changing nothing: test_ansible_static's local-slot test.)
    # The run's own stop now finds nothing to stop and closes the record.
    assert tfcluster("stop", runs_dir=runs_dir, timeout=120).returncode == 0


@on_containers
def test_teardown_leaves_the_containers_as_found(deployed):
    hosts, ansible, _ = deployed
    teardown = ansible.run("teardown.yml", "-e", "common_remove_user=true", label="teardown")
    assert teardown.returncode == 0, explain(teardown)
    for name in hosts.names:
        assert hosts.inventory_of(name) == hosts.before[name], name
        fence = hosts.ssh(name, "nft list table inet tfcluster")
        assert fence.returncode != 0, "%s: teardown left the firewall's table" % name


@on_containers
def test_down_after_the_engine_died_leaves_nothing(dockerhosts):
    hosts = dockerhosts
    state = dockerd.STATE_FILE.load()
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
    assert not os.path.exists(dockerd.STATE) and not os.path.exists(dh.KNOWN_HOSTS)
    assert not any(p.name.startswith(".build-") for p in image.CACHE.iterdir())
    assert not os.path.exists("/sys/class/net/" + dh.BRIDGE)
    # No route to the containers' subnet is left (a probe would leave this machine instead).
    routes = subprocess.run(["ip", "-o", "route", "show", "to", "match", dh.host_addr(1)],
                            capture_output=True, text=True, check=True).stdout
    assert dh.BRIDGE not in routes and str(dh.SUBNET) not in routes, routes
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            cmd = proc_cmdline(pid)
            assert ".work/dockerhosts" not in cmd, cmd
    assert firewall_and_sysctls() == hosts.found
    diff = subprocess.run(["git", "diff", "--quiet", "--", "inventory/compose.yml"], cwd=REPO)
    assert diff.returncode == 0, "down did not put back the committed inventory/compose.yml"
    again = script("down", timeout=120)
    assert again.returncode == 0 and "nothing left" in again.stdout, again.stderr
