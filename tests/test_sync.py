"""`tfcluster sync` and `launch --sync`: the host code (and a user's folder) onto every machine,
only what changed, stale files deleted, trainers.sha256 kept right.

The fast tests run the CLI in-process against a local slot whose tfcluster_root is a temporary
folder (the same host script as over SSH, through a pipe), with a copy of the host packages as
the controller's code. The SSH tests use the netns test hosts (root)."""
import fcntl
import os
import shutil
import sys
import threading

import pytest

from support import REPO
from support.cli import run_cli as run, run_record, tfcluster
from support.ssh import ssh_inventory
from tfcluster.spec import catalog
from tfcluster.data import fetch as datafetch
from tfcluster.runs import record
from tfcluster.deploy import sync
from tfcluster.hosts.fanout import Hosts
from tfcluster.hosts.inventory import Machine
from tfcluster_agent import taskspec
from tfcluster_agent.hostcode import code_hash, packages


def host_inventory(tmp_path, root, extra=""):
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  vars:\n    ansible_connection: local\n    tfcluster_root: %s\n"
                    "    tfcluster_python: %s\n%s"
                    "worker:\n  hosts:\n    w0: {ansible_host: localhost}\n"
                    "ps:\n  hosts:\n    p0: {ansible_host: localhost}\n"
                    % (root, sys.executable, extra))
    return str(path)


@pytest.fixture
def controller(tmp_path, monkeypatch):
    """A copy of the host packages as this controller's code (the test edits it freely)."""
    code = tmp_path / "controller"
    for package in packages():
        shutil.copytree(os.path.join(REPO, package), code / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(sync, "code_root", lambda: str(code))
    return code


def sync_lines(capsys, *args):
    code, out, err = run(capsys, "sync", *args)
    assert code == 0, err
    return out.splitlines()


def test_sync_sends_only_what_changed_and_deletes_stale_files(tmp_path, capsys, controller):
    root = tmp_path / "host"
    root.mkdir()
    inventory = host_inventory(tmp_path, root)
    # Two slots, one machine: one target.
    first = sync_lines(capsys, "-i", inventory)
    count = sum(1 for p in packages() for _, _, files in os.walk(controller / p) for _ in files)
    assert len(first) == 2 and " %d file(s) sent" % count in first[0], first
    assert (root / "trainers.sha256").read_text() == code_hash(str(controller)) + "\n"
    assert code_hash(str(root)) == code_hash(str(controller))
    assert "0 file(s) sent" in sync_lines(capsys, "-i", inventory)[0]
    # Hashing on the host imported its tfcluster_agent without leaving compiled files there.
    assert not (root / "tfcluster_agent" / "__pycache__").exists()

    # One changed file travels alone; a file and a folder gone from the controller go from the host.
    module = controller / "trainers" / "mnist_replica.py"
    module.write_text(module.read_text() + "\n# edited\n")
    os.chmod(controller / "trainers" / "common" / "loop.py", 0o755)
    (root / "trainers" / "stale.py").write_text("x = 1\n")
    (root / "trainers" / "old").mkdir()
    (root / "trainers" / "old" / "gone.py").write_text("y = 2\n")
    (root / "trainers" / "__pycache__").mkdir(exist_ok=True)
    (root / "trainers" / "__pycache__" / "kept.pyc").write_bytes(b"")
    shutil.rmtree(controller / "trainers" / "__pycache__", ignore_errors=True)
    lines = sync_lines(capsys, "-i", inventory)
    assert "2 file(s) sent" in lines[0] and "2 deleted" in lines[0], lines
    assert (root / "trainers" / "mnist_replica.py").read_text().endswith("# edited\n")
    assert os.stat(root / "trainers" / "common" / "loop.py").st_mode & 0o777 == 0o755
    assert not (root / "trainers" / "stale.py").exists() and not (root / "trainers" / "old").exists()
    assert (root / "trainers" / "__pycache__" / "kept.pyc").exists()  # caches are never touched
    assert (root / "trainers.sha256").read_text() == code_hash(str(controller)) + "\n"


def test_only_host_code_makes_a_host_stale(tmp_path, capsys, monkeypatch):
    """The controller's own files (the run record's fields, an example's defaults in the catalog,
    a data set's record) are no host code: editing them leaves a synced host up to date. An edit
    to host code makes it stale, and the next sync sends that file alone."""
    code = tmp_path / "controller"
    for package in ("tfcluster",) + packages():
        shutil.copytree(os.path.join(REPO, package), code / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(sync, "code_root", lambda: str(code))
    root = tmp_path / "host"
    root.mkdir()
    inventory = host_inventory(tmp_path, root)
    sync_lines(capsys, "-i", inventory)
    assert code_hash(str(root)) == code_hash(str(code))
    # The files the controller really reads, at their place in the copy.
    for path, edit in ((record.__file__, "\n# a new field\n"),
                       (catalog.CATALOG, "\n# new defaults\n"),
                       (datafetch.MANIFEST, "\n")):
        copy = code / os.path.relpath(path, REPO)
        copy.write_text(copy.read_text() + edit)
        assert code_hash(str(root)) == code_hash(str(code)), path
    assert "0 file(s) sent" in sync_lines(capsys, "-i", inventory)[0]
    for path in (taskspec.__file__, os.path.join(REPO, "trainers", "common", "loop.py")):
        copy = code / os.path.relpath(path, REPO)
        before = code_hash(str(code))
        copy.write_text(copy.read_text() + "\n# edited\n")
        assert code_hash(str(root)) != code_hash(str(code)) != before, path
        assert "1 file(s) sent" in sync_lines(capsys, "-i", inventory)[0]
        assert code_hash(str(root)) == code_hash(str(code))


def test_user_code_lands_in_the_code_folder(tmp_path, capsys, controller):
    root = tmp_path / "host"
    root.mkdir()
    mine = tmp_path / "mine"
    (mine / "pkg").mkdir(parents=True)
    (mine / "train.py").write_text("print('hi')\n")
    (mine / "pkg" / "model.py").write_text("W = 1\n")
    (mine / ".git").mkdir()
    (mine / ".git" / "HEAD").write_text("ref\n")
    # From the inventory variable...
    inventory = host_inventory(tmp_path, root, "    tfcluster_code_dir: %s\n" % mine)
    lines = sync_lines(capsys, "-i", inventory)
    assert "code in %s/code" % root in lines[0]
    assert (root / "code" / "train.py").read_text() == "print('hi')\n"
    assert (root / "code" / "pkg" / "model.py").exists() and not (root / "code" / ".git").exists()
    # ... or --code, which wins; files of the former folder are stale now.
    other = tmp_path / "other"
    other.mkdir()
    (other / "run.py").write_text("pass\n")
    lines = sync_lines(capsys, "-i", inventory, "--code", str(other))
    assert sorted(os.listdir(root / "code")) == ["run.py"], lines


def test_local_slots_of_this_checkout_need_nothing(tmp_path, capsys):
    inventory = host_inventory(tmp_path, REPO)
    lines = sync_lines(capsys, "-i", inventory)
    assert lines[-1].startswith("sync: 0 host(s) up to date"), lines
    assert not os.path.exists(os.path.join(REPO, "code"))


@pytest.mark.parametrize("args, code, message", [
    (["-i", "no/such/inventory.yml"], 2, "inventory no/such/inventory.yml does not exist"),
    (["--code", "/no/such/folder"], 2, "--code /no/such/folder is not a folder"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, code, message):
    if "-i" not in args:
        args = args + ["-i", host_inventory(tmp_path, tmp_path)]
    got, _, err = run(capsys, "sync", *args)
    assert got == code and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_unreachable_host_is_named_exit_3(tmp_path, capsys, controller):
    root = tmp_path / "host"
    root.mkdir()
    path = tmp_path / "hosts.yml"
    # Port 1 of this machine: refused at once. The local slot is synced all the same.
    path.write_text("all:\n  vars:\n    tfcluster_root: %s\n    tfcluster_python: %s\n"
                    "worker:\n  hosts:\n    w0: {ansible_host: 127.0.0.1, ansible_port: 1}\n"
                    "ps:\n  hosts:\n    p0: {ansible_host: localhost, ansible_connection: local}\n"
                    % (root, sys.executable))
    got, out, err = run(capsys, "sync", "-i", str(path))
    assert got == 3, err
    assert "sync failed on 1 of 2 host(s): 127.0.0.1:1: connection refused on port 1" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert code_hash(str(root)) == code_hash(str(controller))


def test_a_host_without_the_deploy_is_told_to_deploy(tmp_path, capsys, controller):
    got, _, err = run(capsys, "sync", "-i", host_inventory(tmp_path, tmp_path / "absent"))
    assert got == 3 and "no tfcluster_root %s: run the deploy first" % (tmp_path / "absent") in err, err


def test_a_listing_after_installing_the_agent_waits_for_another_machines_install(
        tmp_path, controller, monkeypatch):
    """Machines sharing a root each install the agent when none answers. Once one has, its
    listing must not import the modules while another's tar rewrites them (a half-written
    module failed the listing): it waits for the lock that tar holds."""
    root = tmp_path / "shared"
    root.mkdir()
    machine = Machine(address="lab1", connection="local", python=sys.executable, root=str(root))
    lock = open(root / ".sync-lock", "a")
    real_install = sync.install_agent
    unpacking = threading.Event()

    def install_then_another_unpacks(link):
        installed = real_install(link)
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other machine's tar, under the lock
        unpacking.set()
        return installed

    monkeypatch.setattr(sync, "install_agent", install_then_another_unpacks)
    listed = []
    with Hosts([machine]) as hosts:
        lister = threading.Thread(target=lambda: listed.append(sync.list_target(
            hosts.link(machine), ["tfcluster_agent"])))
        try:
            lister.start()
            assert unpacking.wait(60)
            lister.join(1.5)  # an unlocked listing takes a fraction of this
            assert lister.is_alive() and not listed, "listed while the agent was being unpacked"
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
        lister.join(60)
    assert listed and "tfcluster_agent/agent.py" in listed[0][0]["areas"]["tfcluster_agent"]["files"]


# ---------------------------------------------------------------- over SSH (netns test hosts)


def ssh_hosts_inventory(testhosts, tmp_path):
    """ssh_inventory's 3 test hosts with tfcluster_root in each host's own /opt: code there is per host."""
    path = ssh_inventory(testhosts, tmp_path)
    root = "/opt/tfc-sync/%s" % tmp_path.name
    text = open(path).read()
    assert "tfcluster_root: %s\n" % REPO in text
    with open(path, "w") as handle:
        handle.write(text.replace("tfcluster_root: %s\n" % REPO, "tfcluster_root: %s\n" % root))
    return path, root


@pytest.mark.slow
@pytest.mark.root
def test_stale_code_is_refused_and_sync_fixes_it(testhosts, tmp_path):
    inventory, root = ssh_hosts_inventory(testhosts, tmp_path)
    names = [name for name, _ in testhosts.hosts[:3]]
    addresses = [address for _, address in testhosts.hosts[:3]]
    runs_dir = str(tmp_path / "runs")
    # A built-in example: a --cmd run does not need the trainer code, so it is never refused.
    launch = ("launch", "mnist_replica", "--smoke", "-i", inventory, "--timeout", "400")
    try:
        for name in names:
            assert testhosts.ssh(name, "mkdir -p %s" % root).returncode == 0
        # Nothing there yet: refused, every host named.
        proc = tfcluster(*launch, runs_dir=runs_dir, timeout=300)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        for address in addresses:
            assert "%s: no tfcluster agent at %s" % (address, root) in proc.stderr, proc.stderr
        proc = tfcluster("sync", "-i", inventory, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        expected = code_hash(REPO)
        for name in names:
            recorded = testhosts.ssh(name, "cat %s/trainers.sha256" % root).stdout.strip()
            assert recorded == expected, name

        # One host's copy goes stale: a file edited, a file added that the checkout lacks.
        stale = "%s/trainers/mnist_replica.py" % root
        assert testhosts.ssh(names[1], "echo '# edited on the host' >> %s && "
                                       "echo 'x = 1' > %s/trainers/extra_module.py"
                             % (stale, root)).returncode == 0
        proc = tfcluster(*launch, runs_dir=runs_dir, timeout=300)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "%s: its trainer code differs" % addresses[1] in proc.stderr, proc.stderr
        assert addresses[0] + ":" not in proc.stderr and addresses[2] + ":" not in proc.stderr

        # launch --sync: only the edited file travels, only to that host; the extra one goes.
        # Every inventory host is synced; one worker (on that host) beside the ps is enough to
        # show the launch now passes the code check, and starts one TensorFlow fewer.
        proc = tfcluster(*launch, "--workers", "1", "--sync", "--plain", runs_dir=runs_dir,
                         timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        lines = [line for line in proc.stdout.splitlines() if line.startswith("sync: ")]
        sent = {line.split()[1]: line for line in lines[:-1]}
        assert "1 file(s) sent" in sent[addresses[1]] and "1 deleted" in sent[addresses[1]], lines
        assert "0 file(s) sent" in sent[addresses[0]] and "0 file(s) sent" in sent[addresses[2]]
        assert testhosts.ssh(names[1], "test ! -e %s/trainers/extra_module.py && ! grep -q "
                                       "'edited on the host' %s" % (root, stale)).returncode == 0
        record = run_record(runs_dir)
        assert sorted(record["tasks"]) == ["ps:0", "worker:0"]
        assert record["tasks"]["worker:0"]["state"] == "succeeded"
        assert record["tasks"]["worker:0"]["host"] == addresses[1], record["tasks"]["worker:0"]
    finally:
        for name in names:
            testhosts.ssh(name, "rm -rf %s" % root)


@pytest.mark.slow
@pytest.mark.root
def test_sync_names_the_unreachable_host(testhosts, tmp_path):
    inventory, root = ssh_hosts_inventory(testhosts, tmp_path)
    text = open(inventory).read()
    name, address = testhosts.hosts[2]
    open(inventory, "w").write(text.replace(
        "%s: {ansible_host: %s}" % (name, address),
        "%s: {ansible_host: %s, tfcluster_connect_timeout: 2}" % (name, address)))
    try:
        for host, _ in testhosts.hosts[:3]:
            assert testhosts.ssh(host, "mkdir -p %s" % root).returncode == 0
        testhosts.link(3, "down")
        try:
            proc = tfcluster("sync", "-i", inventory, timeout=120)
        finally:
            testhosts.link(3, "up")
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "sync failed on 1 of 3 host(s): %s: cannot connect within 2s" % address in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        # The reachable hosts were synced all the same.
        assert testhosts.ssh(testhosts.hosts[0][0], "cat %s/trainers.sha256" % root).stdout.strip() \
            == code_hash(REPO)
    finally:
        for host, _ in testhosts.hosts[:3]:
            testhosts.ssh(host, "rm -rf %s" % root)
