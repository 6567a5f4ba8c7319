"""Running the repository's playbooks from tests: an Ansible runner that records output and
timings, the output's recap and task statuses, and a tiny fake data set for the datasets role."""
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

from support import REPO
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
                   r"\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)", re.M)
TASK = re.compile(r"^TASK \[(.+?)\] \*+$")
STATUS = re.compile(r"^(ok|changed|skipping|fatal|failed|included): \[([^\]\s]+?)(?: -> [^\]]+)?\]")


def ansible_tool(name):
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
        argv = [ansible_tool("ansible-playbook"), "-i", self.inventory, "playbooks/" + playbook,
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
        close_ssh_masters(self.control_dir)


def close_ssh_masters(folder):
    """End the SSH master connections Ansible left running in FOLDER (ControlPersist)."""
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        subprocess.run(["ssh", "-O", "exit", "-o", "ControlPath=" + os.path.join(folder, name),
                        "tfcluster-test"], capture_output=True, timeout=10)


def explain(proc):
    return "ansible-playbook exited %d (log %s):\n%s\n%s" % (
        proc.returncode, proc.log, proc.stdout[-6000:], proc.stderr[-2000:])


def task_status_runs(output):
    """{(task name, host): [status of each run]} from the default callback's output: a task file
    imported twice runs its tasks twice under the same names."""
    runs, task = {}, None
    for line in output.splitlines():
        match = TASK.match(line)
        if match:
            task = match.group(1)
            continue
        match = STATUS.match(line)
        if match and task:
            runs.setdefault((task, match.group(2)), []).append(match.group(1))
    return runs


def task_statuses(output):
    """{(task name, host): status of its first run} from the default callback's output."""
    return {key: statuses[0] for key, statuses in task_status_runs(output).items()}


def tiny_dataset(folder, mirror_url=None):
    """A fake data set: two files in the controller cache (one an archive to extract) and one
    that only a mirror has, the first mirror being broken. The mirror is FOLDER/mirror, which
    MIRROR_URL serves (default: its file:// URL). Returns (manifest, cache dir)."""
    cache = os.path.join(folder, "cache", "tiny")
    mirror = os.path.join(folder, "mirror")
    os.makedirs(cache)
    os.makedirs(mirror, exist_ok=True)  # a server may be serving it already
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
         "urls": ["file:///nonexistent/remote.txt", (mirror_url or "file://" + mirror) + "/remote.txt"]},
    ]}}
    path = os.path.join(folder, "datasets.json")
    with open(path, "w") as handle:
        json.dump(manifest, handle)
    return path, os.path.join(folder, "cache")


def run_on_local_hosts(tmp_path, hosts, tasks, *args, env=None):
    """ansible-playbook of TASKS (YAML, indented as a play's) after the tfcluster role on local
    HOSTS ({name: host vars as YAML}), offline from tmp_path's wheelhouse, the checkout's code:
    its roles, and the collection's modules they run (as the checkout's ansible.cfg finds them)."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  vars:\n    ansible_connection: local\n"
        "    ansible_python_interpreter: %s\n  hosts:\n%s"
        % (sys.executable, "".join("    %s: %s\n" % item for item in hosts.items())))
    playbook = tmp_path / "install.yml"
    playbook.write_text("- name: Install TensorFlow\n  hosts: all\n  gather_subset: [min]\n"
                        "  roles: [tfcluster]\n  tasks:\n" + tasks)
    return subprocess.run(
        [ansible_tool("ansible-playbook"), "-i", str(inventory), str(playbook), *args,
         "-e", "tfcluster_src=" + REPO, "-e", "tensorflow_install_mode=offline",
         "-e", "tensorflow_wheelhouse_src=%s" % (tmp_path / "wheelhouse")],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                 ANSIBLE_ROLES_PATH=os.path.join(REPO, "roles"),
                 ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, "collections"), **(env or {})))
