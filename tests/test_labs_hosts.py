"""Labs as they are, on the test hosts (docs/labs.md): an ordinary user with no sudo and one
home for every host (the test hosts share this machine's /home, as lab servers share an NFS
home), the administrator's half of the deploy done by root, the user's half by the user, then
sync, launch, status, logs, stop, check and `tfcluster gpus` as that user, every built-in
example across the shared home; a second user's runs beside the first one's; a 16-host launch
with one shared workdir.

The controller runs as root here (the checkout may sit where no other user can enter); the
hosts only ever see the ordinary user (ansible_user), who cannot become root. Tests run in file
order against one module fixture: the user, their inventory, and what the root step made, which
the fixture removes again (the fence, the service group, the GPU fact in the shared /etc).
"""
import grp
import json
import os
import shutil
import subprocess
import sys
import traceback

import pytest

from support import example_smoke
from support.ansible_run import Ansible, task_status_runs
from support import REPO
from support.cli import run_record, tfcluster
from support.locks import ready_wheelhouse
from support.rootstep import FENCE_FILE, netns_nft, remove_root_step, root_step_state
from support.testhosts import HostSet, exclusive
from hostlib import labusers
from tfcluster.spec.catalog import load_catalog

pytestmark = [pytest.mark.slow, pytest.mark.root]

USER, OTHER = "tfc-lab1", "tfc-lab2"
PORT_BASE = 24400  # the fence (the root step) covers 24400-24499 for these inventories
FAKE = os.path.join(REPO, "tests", "programs", "fake_task.py")
FAKE_SMI = os.path.join(REPO, "tests", "programs", "nvidia-smi")


def lab_inventory(testhosts, path, user, wheelhouse, **extra):
    lines = ["all:", "  vars:", "    ansible_user: %s" % user,
             "    ansible_ssh_private_key_file: %s" % testhosts.key,
             '    ansible_ssh_common_args: "-o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes '
             '-o ConnectTimeout=5"' % testhosts.known_hosts,
             "    ansible_python_interpreter: /usr/bin/python3",
             "    tfcluster_known_hosts: %s" % testhosts.known_hosts,
             "    tensorflow_install_mode: offline",
             "    tensorflow_wheelhouse_src: %s" % wheelhouse,
             "    tfcluster_port_base: %d" % PORT_BASE]
    lines += ["    %s: %s" % item for item in extra.items()]
    (ps, ps_addr), *workers = testhosts.hosts[:3]
    lines += ["  children:", "    ps:", "      hosts:", "        %s: {ansible_host: %s}" % (ps, ps_addr),
              "    worker:", "      hosts:"]
    lines += ["        %s: {ansible_host: %s}" % host for host in workers]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


class Lab:
    """One ordinary user's view: their inventory, runs folder and home; the controller's
    Ansible connections (closed at the end)."""

    def __init__(self, testhosts, work, user, wheelhouse):
        self.testhosts, self.work, self.user, self.wheelhouse = testhosts, work, user, wheelhouse
        self.entry = labusers.add(user, str(testhosts.key) + ".pub")
        self.home = self.entry.pw_dir
        self.root = os.path.join(self.home, "tfcluster")
        self.inventory = lab_inventory(testhosts, work / ("%s.yml" % user), user, self.wheelhouse)
        self.runs = str(work / ("runs-" + user))
        (work / "extra.json").write_text("{}")
        self.ansible = Ansible(self.inventory, str(work / "extra.json"), str(work / user))

    def cli(self, *args, check=None, timeout=900):
        env = {"ANSIBLE_SSH_CONTROL_PATH_DIR": self.ansible.control_dir, "ANSIBLE_NOCOLOR": "1"}
        return tfcluster(*args, runs_dir=self.runs, check=check, timeout=timeout, env=env)

    def ssh(self, host, command):
        """COMMAND on HOST as this user (the test hosts' sshd takes the client key for anyone)."""
        argv = self.testhosts.ssh_argv(host, command)
        argv[-2] = "%s@%s" % (self.user, self.testhosts.addr(host))
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=60)

    def close(self):
        self.ansible.close()
        labusers.remove(self.user)


@pytest.fixture(scope="module")
def lab(testhosts, tmp_path_factory):
    """The user tfc-lab1 and what the tests make for them; afterwards the user, their home and
    whatever the root step put into this machine's /etc are gone again."""
    # A copy of its own: the container session may replace the checkout's between two deploys.
    work = tmp_path_factory.mktemp("labs")
    wheelhouse = ready_wheelhouse(copy_to=str(work / "wheelhouse"))
    assert wheelhouse.returncode == 0, wheelhouse.stdout[-3000:] + wheelhouse.stderr[-3000:]
    made, before = root_step_state()
    lab = Lab(testhosts, work, USER, str(work / "wheelhouse"))
    try:
        yield lab
    finally:
        try:
            lab.close()
        finally:  # what the root step left in /etc goes even when the user's removal failed
            remove_root_step(testhosts, made, before)


def test_a_users_deploy_refuses_without_the_administrators_half(lab):
    """GPU machines (tfcluster_gpu) without a driver: one line per machine, the administrator's
    command in it, and nothing made in the user's home."""
    proc = lab.cli("deploy", "-i", lab.inventory, "-e", "tfcluster_gpu=true")
    assert proc.returncode != 0, proc.stdout[-3000:]
    for name, _ in lab.testhosts.hosts[:3]:
        line = ("%s: no NVIDIA driver (nvidia-smi does not answer): an administrator runs "
                "`tfcluster deploy --system -i %s --limit %s` (root on the host)"
                % (name, lab.inventory, name))
        assert [text for text in proc.stdout.splitlines() if line in text], proc.stdout[-4000:]
    assert not os.path.exists(lab.root)


def test_the_root_step_is_one_command(lab):
    """`tfcluster deploy --system` as root: the fence in each host's namespace, nothing of the
    user's half (no venv, no tfcluster_root anywhere)."""
    proc = lab.cli("deploy", "--system", "-i", lab.inventory, "-e", "ansible_user=root")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for name, _ in lab.testhosts.hosts[:3]:
        table = netns_nft(lab.testhosts, name, "list", "table", "inet", "tfcluster")
        assert table.returncode == 0 and "%d-%d" % (PORT_BASE, PORT_BASE + 99) in table.stdout
        assert lab.testhosts.ssh(name, "test -e /opt/tfcluster").returncode == 1
    assert os.path.exists(FENCE_FILE) and not os.path.exists(lab.root)
    assert "tfcluster" in {g.gr_name for g in grp.getgrall()}


def test_a_users_deploy_into_a_shared_home(lab):
    """The user's half as the user: one home for three machines, so the first writes the venv
    (one unpack of the packed venv), the code and the folders, the others find them; every
    file is the user's; a second deploy finds every machine as its stamp says."""
    proc = lab.cli("deploy", "-i", lab.inventory)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    (first, _), (second, _), (third, _) = lab.testhosts.hosts[:3]
    for name in (second, third):
        assert "%s shares tfcluster_root %s with %s, which writes it" % (name, lab.root, first) \
            in proc.stdout
    runs = task_status_runs(proc.stdout)
    unpacked = [host for (task, host), states in runs.items()
                if task.endswith("Ensure the packed environment is unpacked into the venv")
                and "changed" in states]
    assert unpacked == [first], unpacked
    uid = lab.entry.pw_uid
    others = [os.path.join(top, name) for top, dirs, files in os.walk(lab.root)
              for name in dirs + files if os.lstat(os.path.join(top, name)).st_uid != uid]
    assert not others, others[:5]
    assert sorted(n for n in os.listdir(lab.root) if n.startswith(".deploy-stamp")) == [
        ".deploy-stamp-%s.json" % name for name in (first, second, third)]
    again = lab.cli("deploy", "-i", lab.inventory)
    assert again.returncode == 0, again.stdout[-4000:]
    for name in (first, second, third):
        assert "%s: as its deploy stamp says, not provisioned again" % name in again.stdout


def user_code(lab):
    """A folder of the user's own code: the fake task, and an nvidia-smi that answers from a
    state file per host (FakeGpus' format) in the same folder."""
    code = lab.work / "code"
    code.mkdir(exist_ok=True)
    shutil.copy(FAKE, code / "fake_task.py")
    shutil.copy(FAKE_SMI, code / "fake_smi.py")
    states = {"th1": {"driver": "580.65.06", "gpus": [{"uuid": "GPU-lab-1"}, {"uuid": "GPU-lab-2"}]},
              "th2": {"driver": "580.65.06", "gpus": [{"uuid": "GPU-lab-3", "ecc": 3}]}}
    for name, state in states.items():
        (code / ("%s.json" % name)).write_text(json.dumps(state))
    wrapper = code / "nvidia-smi"
    wrapper.write_text('#!/bin/sh\nhere=$(dirname "$0")\nFAKE_NVIDIA_SMI_STATE="$here/$(hostname)'
                       '.json" exec /usr/bin/python3 "$here/fake_smi.py" "$@"\n')
    wrapper.chmod(0o755)
    return str(code)


def one_writer(out, lab):
    """True when sync's output OUT shows one machine writing the shared root, the others
    naming it."""
    sent = [line.split()[1] for line in out.splitlines() if "file(s) sent" in line]
    shared = sorted(line.split()[1] for line in out.splitlines() if "shares tfcluster_root" in line
                    and line.endswith("%s with %s, which writes it" % (lab.root, sent[:1] and sent[0])))
    return len(sent) == 1 and sorted(sent + shared) == sorted(a for _, a in lab.testhosts.hosts[:3])


def test_sync_launch_status_logs_stop_check_and_gpus_as_the_user(lab):
    (first, _), (second, _), (third, _) = lab.testhosts.hosts[:3]
    code = os.path.join(lab.root, "code")
    synced = lab.cli("sync", "-i", lab.inventory, "--code", user_code(lab), check=0)
    assert one_writer(synced.stdout, lab), synced.stdout
    launched = lab.cli("launch", "--cmd", "python fake_task.py", "--cwd", code, "-i", lab.inventory,
                       "--detach", "--run-id", "lab", "--env", "FAKE_WORKER_0=forever",
                       "--env", "FAKE_WORKER_1=forever", check=0)
    # Fenced by the root step: no warning; one workdir for three machines, a run folder each.
    assert "no firewall fences" not in launched.stdout + launched.stderr
    run_dir = os.path.join(lab.root, "work", "lab")
    assert sorted(os.listdir(run_dir)) == [".launch", first, second, third]
    assert {os.stat(os.path.join(run_dir, n)).st_uid for n in os.listdir(run_dir)} == {
        lab.entry.pw_uid}
    status = lab.cli("status", "lab", check=0)
    assert status.stdout.count(" running ") == 3, status.stdout
    logs = lab.cli("logs", "lab", "--task", "worker:1", check=0)
    assert "fake worker:1 starting" in logs.stdout
    lab.cli("stop", "lab", check=0)
    record = run_record(lab.runs, "lab")
    assert record["state"] == "stopped"
    for label, task in record["tasks"].items():
        assert task["host_run_dir"] == os.path.join(run_dir, {"ps:0": first, "worker:0": second,
                                                               "worker:1": third}[label])
        with open(os.path.join(lab.runs, "lab", label.replace(":", "-") + ".log")) as handle:
            assert "fake %s starting" % label in handle.read()
    for name in (first, second, third):
        assert lab.ssh(name, "pgrep -u %s -f [f]ake_task.py" % lab.user).stdout == ""
    # The code hash and the stale-code check: a file changed in the shared root is stale on
    # every machine until one sync (one writer) puts it right.
    assert "all 3 host(s) ready" in lab.cli("check", "-i", lab.inventory, check=0).stdout
    assert lab.ssh(first, "echo '# changed' >> ~/tfcluster/trainers/loop.py").returncode == 0
    stale = lab.cli("check", "-i", lab.inventory, check=3)
    assert stale.stderr.count("its trainer code differs from this checkout's") == 3, stale.stderr
    assert one_writer(lab.cli("sync", "-i", lab.inventory, check=0).stdout, lab)
    assert "all 3 host(s) ready" in lab.cli("check", "-i", lab.inventory, check=0).stdout
    inventory = lab_inventory(lab.testhosts, lab.work / "gpus.yml", lab.user, lab.wheelhouse,
                              tfcluster_nvidia_smi=os.path.join(code, "nvidia-smi"))
    gpus = lab.cli("gpus", "-i", inventory, check=1)  # the third host's nvidia-smi fails
    rows = sorted(line.split()[:3] for line in gpus.stdout.splitlines()[1:])
    assert rows == [[lab.testhosts.addr(first), "0", "NVIDIA"], [lab.testhosts.addr(first), "1", "NVIDIA"],
                    [lab.testhosts.addr(second), "0", "NVIDIA"], [lab.testhosts.addr(third), "-", "ERROR:"]], \
        gpus.stdout
    assert "FAILING: ECC errors: 3" in gpus.stdout


def every_example_inventory(lab):
    """The lab inventory with slots enough for every example (2 ps, 3 workers, a chief) on the
    same three machines: several slots of one machine share its home, venv and code."""
    (first, a1), (second, a2), (third, a3) = lab.testhosts.hosts[:3]
    text = open(lab.inventory).read().split("  children:")[0]
    text += ("  children:\n    ps:\n      hosts:\n        %s: {ansible_host: %s}\n"
             "        %s-ps: {ansible_host: %s}\n    worker:\n      hosts:\n"
             "        %s: {ansible_host: %s}\n        %s: {ansible_host: %s}\n"
             "        %s-w: {ansible_host: %s}\n    chief:\n      hosts:\n"
             "        %s-chief: {ansible_host: %s}\n"
             % (first, a1, second, a2, second, a2, third, a3, first, a1, third, a3))
    path = lab.work / "every-example.yml"
    path.write_text(text)
    return str(path)


def test_every_example_trains_across_the_shared_home(lab):
    """Every built-in example (--smoke) from the user's venv, code and data sets in the shared
    home: each succeeds, each machine runs in its own run folder, each task's log comes back,
    nothing is left running; and each run shows what its example must do (example_smoke.CHECKS:
    learning, where the variables live, how updates are applied): one launch per example, and
    mnist_async's second, which resumes from the first one's checkpoint (an example whose --smoke
    launch is the same as another's, fashion_mnist's, is not launched twice)."""
    hostnames = {name for name, _ in lab.testhosts.hosts[:3]}
    inventory = every_example_inventory(lab)
    names = [line.split()[0] for line in lab.cli("examples", check=0).stdout.splitlines()]
    assert len(names) >= 12 and "mnist_replica" in names, names
    assert set(example_smoke.CHECKS) <= set(names), sorted(set(example_smoke.CHECKS) - set(names))
    # An example whose --smoke launch is another's, but for its name, is proven by that launch.
    twins = example_smoke.smoke_twins(load_catalog())
    assert not set(twins) & set(example_smoke.CHECKS), twins
    failed = {}
    for example in [name for name in names if name not in twins]:
        run_id = "lab-" + example.replace("_", "-")
        proc = lab.cli("launch", example, "-i", inventory, "--smoke", "--run-id", run_id)
        if proc.returncode != 0:
            failed[example] = (proc.stdout[-1500:] + proc.stderr[-1500:])
            continue
        record = run_record(lab.runs, run_id)
        run_dir = os.path.join(lab.root, "work", run_id)
        machines = {task["address"].rsplit(":", 1)[0] for task in record["tasks"].values()}
        for label, task in record["tasks"].items():
            if len(machines) == 1:  # no other machine of the run shares the workdir
                assert task["host_run_dir"] == run_dir, (example, task)
            else:
                assert os.path.dirname(task["host_run_dir"]) == run_dir, (example, task)
                assert os.path.basename(task["host_run_dir"]) in hostnames, (example, task)
            log = os.path.join(lab.runs, run_id, label.replace(":", "-") + ".log")
            assert os.path.getsize(log) > 0, (example, label)
        check = example_smoke.CHECKS.get(example)
        try:
            if check:
                check(record, os.path.join(lab.runs, run_id))
            if example == "mnist_async":  # trains on from the run's checkpoint
                lab.cli("launch", example, "-i", inventory, "--smoke", "--run-id", run_id + "-2",
                        "--resume", run_id, *example_smoke.RESUME_MNIST_ASYNC, check=0)
                example_smoke.check_mnist_async_resumed(record, run_record(lab.runs, run_id + "-2"))
        except AssertionError:
            failed[example] = traceback.format_exc(limit=-3)
    assert not failed, "\n".join("%s:\n%s" % item for item in sorted(failed.items()))
    for name in hostnames:
        assert lab.ssh(name, "pgrep -u %s -f [t]rainers" % lab.user).stdout == ""


def test_two_users_side_by_side(lab, tmp_path):
    """A second user on the same hosts, from their own home (the first user's venv, which they
    share with the lab): the same ports are refused naming the first user's run, other ports
    run beside it; the second user can neither stop nor read the first one's run."""
    (first, _), *_ = lab.testhosts.hosts[:3]
    other = Lab(lab.testhosts, tmp_path, OTHER, lab.wheelhouse)
    try:
        os.chmod(lab.home, 0o711)  # the first user lends their venv to the lab
        venv_python = os.path.join(lab.root, "venv", "bin", "python")
        other.inventory = lab_inventory(lab.testhosts, tmp_path / "other.yml", OTHER, lab.wheelhouse,
                                        tfcluster_python=venv_python)
        for name, _ in lab.testhosts.hosts[:3]:  # one home: made once
            assert other.ssh(name, "mkdir -p ~/tfcluster").returncode == 0
        other.cli("sync", "-i", other.inventory, "--code", os.path.join(lab.work, "code"), check=0)
        code = "--cwd", os.path.join(other.root, "code")
        forever = ("--env", "FAKE_WORKER_0=forever", "--env", "FAKE_WORKER_1=forever")
        lab.cli("launch", "--cmd", "python fake_task.py", "--cwd", os.path.join(lab.root, "code"),
                "-i", lab.inventory, "--detach", "--run-id", "first", *forever, check=0)
        refused = other.cli("launch", "--cmd", "python fake_task.py", *code, "-i", other.inventory,
                            "--detach", "--run-id", "second", *forever, check=3)
        assert "claimed by run first (user %s)" % USER in refused.stderr, refused.stderr
        moved = lab_inventory(lab.testhosts, tmp_path / "moved.yml", OTHER, lab.wheelhouse,
                              tfcluster_python=venv_python, tfcluster_port_base=PORT_BASE + 10)
        other.cli("launch", "--cmd", "python fake_task.py", *code, "-i", moved, "--detach",
                  "--run-id", "second", *forever, check=0)
        mine = run_record(lab.runs, "first")["tasks"]["ps:0"]
        theirs = run_record(other.runs, "second")["tasks"]["ps:0"]
        assert theirs["host_run_dir"].startswith(other.root + "/work/second/")
        # The other user can neither signal the first user's task nor read its folder.
        attempt = other.ssh(first, "kill -TERM %d; cat %s/ps-0.log" % (mine["pid"],
                                                                        mine["host_run_dir"]))
        assert "Operation not permitted" in attempt.stderr and "Permission denied" in attempt.stderr
        assert lab.ssh(first, "kill -0 %d" % mine["pid"]).returncode == 0
        lab.cli("stop", "first", check=0)
        assert lab.ssh(first, "kill -0 %d" % mine["pid"]).returncode != 0
        assert other.ssh(first, "kill -0 %d" % theirs["pid"]).returncode == 0  # untouched
        other.cli("stop", "second", check=0)
    finally:
        os.chmod(lab.home, 0o700)
        other.close()


def test_sixteen_hosts_share_one_workdir(tmp_path):
    """16 machines, one workdir: each gets its own folder in the run's, the launch succeeds with
    every task's log collected, each unfenced host is named once, and a second launch with the
    same run id (another controller: another runs folder) is refused on the hosts."""
    work = tmp_path / "shared-work"
    with exclusive():
        hosts = HostSet(16)
        hosts.up()
        inventory = tmp_path / "sixteen.yml"
        lines = ["all:", "  vars:", "    ansible_user: root",
                 "    ansible_ssh_private_key_file: %s" % hosts.key,
                 "    tfcluster_known_hosts: %s" % hosts.known_hosts,
                 "    tfcluster_root: %s" % REPO, "    tfcluster_python: %s" % sys.executable,
                 "    tfcluster_workdir: %s" % work, "    tfcluster_port_base: %d" % PORT_BASE,
                 # The hosts share this machine's /etc, where other tests fence theirs.
                 "    firewall_rules_file: %s" % (tmp_path / "no-fence.nft"),
                 "  children:", "    ps:", "      hosts:",
                 "        %s: {ansible_host: %s}" % hosts.hosts[0], "    worker:", "      hosts:"]
        lines += ["        %s: {ansible_host: %s}" % host for host in hosts.hosts[1:]]
        inventory.write_text("\n".join(lines) + "\n")
        proc = tfcluster("launch", "--cmd", "python " + FAKE, "-i", str(inventory), "--workers",
                         "all", "--run-id", "wide", runs_dir=str(tmp_path / "runs"))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        names = [name for name, _ in hosts.hosts]
        assert sorted(os.listdir(work / "wide")) == sorted([".launch"] + names)
        for name, address in hosts.hosts:
            warned = [line for line in (proc.stdout + proc.stderr).splitlines()
                      if "warning: %s: no firewall fences" % address in line]
            assert len(warned) == 1, (address, warned)
        record = run_record(str(tmp_path / "runs"), "wide")
        assert len(record["tasks"]) == 16 and record["state"] == "succeeded"
        for label in record["tasks"]:
            path = tmp_path / "runs" / "wide" / (label.replace(":", "-") + ".log")
            assert "fake %s starting" % label in path.read_text()
        again = tfcluster("launch", "--cmd", "python " + FAKE, "-i", str(inventory), "--workers",
                          "all", "--run-id", "wide", runs_dir=str(tmp_path / "other-runs"))
        assert again.returncode == 1 and "another run has this id" in again.stderr, again.stderr
        assert "Traceback" not in again.stderr, again.stderr


