"""Static checks of the Ansible content: lint, syntax, role interfaces, inventory validation.

Nothing here connects to a host: validate.yml only runs controller-side actions.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from support.ports import free_port_block
from support.procs import pid_alive, wait_for

pytestmark = pytest.mark.slow  # ansible-playbook and ansible-lint runs: seconds to minutes each

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES = sorted(d for d in os.listdir(os.path.join(REPO, "roles"))
               if os.path.isdir(os.path.join(REPO, "roles", d)))
PLAYBOOKS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "playbooks", "*.yml")))


def _tool(name):
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else shutil.which(name)


def run(argv, timeout=300, **kw):
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kw)


def load(path):
    with open(os.path.join(REPO, path)) as handle:
        return yaml.safe_load(handle)


def test_ansible_lint_production_profile():
    lint = _tool("ansible-lint")
    if not lint:
        pytest.skip("ansible-lint is not installed (pip install ansible-lint)")
    proc = run([lint, "--offline", "--profile", "production", "--nocolor", "playbooks/", "roles/"],
               timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]


@pytest.fixture(scope="module")
def syntax_check():
    """One ansible-playbook --syntax-check of every playbook (it stops at the first bad one, and
    names it): one interpreter start, not one a playbook."""
    return run([_tool("ansible-playbook"), "-i", "inventory/sample", "--syntax-check"]
               + ["playbooks/" + playbook for playbook in PLAYBOOKS])


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax(playbook, syntax_check):
    proc = syntax_check
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "playbook: playbooks/%s\n" % playbook in proc.stdout, proc.stdout


def test_expected_roles_and_playbooks_exist():
    assert {"common", "nvidia_driver", "cuda", "tensorflow", "trainers", "datasets",
            "tfcluster"} <= set(ROLES)
    assert {"deploy.yml", "stop.yml", "teardown.yml", "validate.yml"} <= set(PLAYBOOKS)


@pytest.mark.parametrize("role", ROLES)
def test_role_defaults_are_prefixed_commented_and_declared(role):
    defaults_path = "roles/%s/defaults/main.yml" % role
    defaults = load(defaults_path) or {}
    assert defaults, "%s declares no defaults" % role
    for name in defaults:
        assert name.startswith(role + "_"), "%s: %s is not prefixed with %s_" % (role, name, role)
    # Each default has a comment on the line(s) right above it.
    lines = open(os.path.join(REPO, defaults_path)).read().splitlines()
    for index, line in enumerate(lines):
        match = re.match(r"^([a-z_0-9]+):", line)
        if match:
            assert index > 0 and lines[index - 1].startswith("#"), (
                "%s: %s has no comment line above it" % (defaults_path, match.group(1)))
    assert os.path.exists(os.path.join(REPO, "roles", role, "meta", "main.yml"))
    specs = load("roles/%s/meta/argument_specs.yml" % role)["argument_specs"]
    assert "main" in specs
    options = specs["main"].get("options") or {}
    assert set(options) == set(defaults), "%s: argument_specs and defaults differ: %s" % (
        role, sorted(set(options) ^ set(defaults)))
    for name, spec in options.items():
        assert spec.get("description"), "%s: %s has no description" % (role, name)
        assert spec.get("default") == defaults[name], (
            "%s: %s defaults to %r but argument_specs says %r"
            % (role, name, defaults[name], spec.get("default")))
    for entry, spec in specs.items():
        for name in spec.get("options") or {}:
            assert name in defaults, "%s entry point %s: %s is not a default" % (role, entry, name)


def test_every_tasks_file_is_reached_and_has_an_entry_point_spec():
    """Every tasks file of a role is reached: its main, included by another of its files (a name
    with a `{{ }}` part matches its files), or a tasks_from entry point, which has its own
    argument spec."""
    text = "\n".join(open(p).read() for p in glob.glob(os.path.join(REPO, "playbooks", "*.yml"))
                     + glob.glob(os.path.join(REPO, "roles", "*", "tasks", "*.yml")))
    for role in ROLES:
        specs = load("roles/%s/meta/argument_specs.yml" % role)["argument_specs"]
        entries = set(re.findall(r"name: %s\n\s+tasks_from: (\w+)\.yml" % role, text))
        for entry in entries:
            assert entry in specs, "%s: tasks_from %s has no argument spec" % (role, entry)
        folder = os.path.join(REPO, "roles", role, "tasks")
        own = "\n".join(open(p).read() for p in glob.glob(os.path.join(folder, "*.yml")))
        included = [re.compile("[\\w-]+".join(map(re.escape, re.split(r"\{\{.*?\}\}", name))) + "$")
                    for name in re.findall(r"(?:include|import)_tasks: ([^\n]+?\.yml)", own)]
        for path in glob.glob(os.path.join(folder, "*.yml")):
            name = os.path.basename(path)
            assert name == "main.yml" or name[:-4] in entries or any(
                pattern.match(name) for pattern in included), \
                "roles/%s/tasks/%s is reached by no play, entry point or include" % (role, name)


def test_roles_readme_lists_every_variable_with_its_default():
    readme = open(os.path.join(REPO, "roles", "README.md")).read()
    rows = {}
    for line in readme.splitlines():
        # Cells split on unescaped pipes; `\|` is a pipe inside a cell (Jinja filters).
        cells = [c.strip().replace("\\|", "|")
                 for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) >= 4 and cells[1].startswith("`") and cells[1].endswith("`"):
            rows[cells[1].strip("`")] = cells[2]
    for role in ROLES:
        for name, value in (load("roles/%s/defaults/main.yml" % role) or {}).items():
            assert name in rows, "roles/README.md does not list %s" % name
            shown = rows[name].strip("`")
            assert yaml.safe_load(shown) == value, (
                "roles/README.md shows %s = %s, the default is %r" % (name, rows[name], value))


def test_playbook_group_vars_define_nothing():
    """Playbook group_vars/all outrank inventory-file group vars: the defaults must not live there."""
    found = [os.path.relpath(p, REPO) for folder in ("group_vars", "host_vars")
             for p in glob.glob(os.path.join(REPO, "playbooks", folder, "**", "*"), recursive=True)
             if os.path.isfile(p)]
    # The placeholder that says why stays where a newcomer would add defaults.
    assert "playbooks/group_vars/all.yml" in found
    for path in found:
        assert not load(path), "%s defines variables: role defaults belong in roles/" % path


def test_ansible_cfg_keeps_host_key_checking_on():
    text = open(os.path.join(REPO, "ansible.cfg")).read()
    assert re.search(r"^host_key_checking\s*=\s*True", text, re.M)
    assert re.search(r"^roles_path\s*=\s*roles", text, re.M)
    assert re.search(r"^inventory\s*=\s*inventory/local.yml", text, re.M)
    assert re.search(r"^retry_files_enabled\s*=\s*False", text, re.M)
    assert "StrictHostKeyChecking=no" not in text


def test_wheelhouse_help():
    # `tfcluster wheelhouse`, and scripts/wheelhouse with a Python that has nothing installed.
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    for argv in ([sys.executable, "-m", "tfcluster", "wheelhouse", "--help"],
                 [python, "-S", os.path.join(REPO, "scripts", "wheelhouse"), "--help"]):
        proc = run(argv)
        assert proc.returncode == 0, proc.stderr
        assert "--gpu" in proc.stdout and "--dest" in proc.stdout and "--lock" in proc.stdout


def test_requirements_leave_tensorflow_to_the_role():
    names = [re.split(r"[<>=!~\[ ]", line.strip())[0].lower()
             for line in open(os.path.join(REPO, "trainers", "requirements.txt"))
             if line.strip() and not line.startswith("#")]
    assert "numpy" in names and "scikit-learn" in names
    assert not [n for n in names if n.startswith("tensorflow")]


def test_gpu_fact_counts_nvidia_controllers(tmp_path):
    fact = os.path.join(REPO, "roles", "nvidia_driver", "files", "gpus.fact")
    assert os.access(fact, os.X_OK)
    fake = tmp_path / "lspci"
    fake.write_text("#!/bin/sh\ncat <<'EOF'\n"
                    "00:02.0 VGA compatible controller: Intel Corporation UHD Graphics\n"
                    "17:00.0 3D controller: NVIDIA Corporation GA100 [A100 PCIe 40GB] (rev a1)\n"
                    "65:00.0 VGA compatible controller: NVIDIA Corporation GA102 (rev a1)\n"
                    "65:00.1 Audio device: NVIDIA Corporation GA102 High Definition Audio\nEOF\n")
    fake.chmod(0o755)
    out = subprocess.run([fact], env={"PATH": "%s:/usr/bin:/bin" % tmp_path}, capture_output=True,
                         text=True, check=True)
    assert yaml.safe_load(out.stdout) == {"count": 2, "nvswitch": 0, "blackwell": False, "lspci": True}
    empty = tmp_path / "empty"
    empty.mkdir()
    for tool in ("sh", "grep", "printf"):
        if shutil.which(tool):
            os.symlink(shutil.which(tool), empty / tool)
    out = subprocess.run(["/bin/sh", fact], env={"PATH": str(empty)}, capture_output=True,
                         text=True, check=True)
    assert yaml.safe_load(out.stdout) == {"count": 0, "nvswitch": 0, "blackwell": False, "lspci": False}


# ------------------------------------------------------------ validate.yml on sample inventories

def validate(tmp_path, inventory_text, *extra):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(inventory_text)
    return run([_tool("ansible-playbook"), "-i", str(inventory), "playbooks/validate.yml", *extra])


def test_validate_accepts_the_sample_inventory():
    proc = run([_tool("ansible-playbook"), "-i", "inventory/sample", "playbooks/validate.yml"])
    assert proc.returncode == 0, proc.stdout[-4000:]
    # gpu01 has chief0 and worker0, gpu02 has worker1 and worker2, cpu01 has ps0 and eval0.
    assert "deploy.yml and teardown.yml provision through: chief0, ps0, worker1" in proc.stdout


def test_validate_takes_workers_alone_and_requires_a_task_group(tmp_path):
    """A workers-only inventory (MultiWorkerMirroredStrategy's shape) validates; one with no host
    in any task group does not, and neither does one that lacks a group tfcluster_required_groups
    names, also under --limit (which leaves the controller's play out: the slots' play checks)."""
    workers = ("all:\n  children:\n    worker:\n      hosts:\n"
               "        w0: {ansible_host: 192.0.2.1}\n        w1: {ansible_host: 192.0.2.2}\n")
    accepted = validate(tmp_path, workers)
    assert accepted.returncode == 0, accepted.stdout[-4000:]
    none = validate(tmp_path, "all:\n  children:\n    gpus:\n      hosts:\n"
                              "        g0: {ansible_host: 192.0.2.1}\n")
    assert none.returncode != 0
    assert "The inventory has no host in a task group" in none.stdout
    assert "this inventory has the groups gpus" in none.stdout
    required = workers.replace("all:\n", "all:\n  vars:\n    tfcluster_required_groups: [ps]\n")
    for extra in ((), ("--limit", "w0")):
        proc = validate(tmp_path, required, *extra)
        assert proc.returncode != 0, extra
        assert "no host in required group(s) ps" in proc.stdout, proc.stdout[-3000:]
        assert "this inventory has the groups worker" in proc.stdout


def test_validate_rejects_an_unquoted_version_and_a_relative_root(tmp_path):
    proc = validate(tmp_path, "all:\n  vars:\n    tfcluster_tf_version: 2.21\n"
                              "    tfcluster_root: opt/tf\n  children:\n"
                              "    ps:\n      hosts:\n        p0: {ansible_host: 192.0.2.1}\n"
                              "    worker:\n      hosts:\n        w0: {ansible_host: 192.0.2.2}\n")
    assert proc.returncode != 0
    assert 'tfcluster_tf_version must be a quoted version string like "2.21.0", not 2.21' in proc.stdout
    assert 'tfcluster_root must be an absolute path, not "opt/tf"' in proc.stdout
    # Nothing after the validation ran.
    assert "Record each slot's machine" not in proc.stdout


def test_validate_provisions_each_machine_once(tmp_path):
    proc = validate(tmp_path, "all:\n  children:\n"
                              "    ps:\n      hosts:\n        p0: {ansible_host: 192.0.2.1}\n"
                              "    worker:\n      hosts:\n"
                              "        w0: {ansible_host: 192.0.2.2}\n"
                              "        w1: {ansible_host: 192.0.2.2}\n"
                              "        w2: {ansible_host: 192.0.2.2, ansible_port: 2222}\n"
                              "        w3: {ansible_host: 192.0.2.1}\n")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "deploy.yml and teardown.yml provision through: p0, w0, w2" in proc.stdout
    assert "Shares machine 192.0.2.2:22 with w0" in proc.stdout
    assert "Shares machine 192.0.2.1:22 with p0" in proc.stdout


def test_validate_rejects_slots_of_one_machine_with_different_roots(tmp_path):
    proc = validate(tmp_path, "all:\n  children:\n"
                              "    ps:\n      hosts:\n        p0: {ansible_host: 192.0.2.1}\n"
                              "    worker:\n      hosts:\n"
                              "        w0: {ansible_host: 192.0.2.1, tfcluster_root: /srv/tf}\n")
    assert proc.returncode != 0
    assert "their tfcluster_root values differ" in proc.stdout


def test_inventory_file_vars_beat_the_defaults(tmp_path):
    """`all: vars:` inside an inventory file (inventory/local.yml does this) must win over the
    cluster-wide defaults: local slots with tfcluster_deploy false are never provisioned."""
    proc = validate(tmp_path, "all:\n  vars:\n    ansible_connection: local\n"
                              "    tfcluster_deploy: false\n    tfcluster_root: /tmp/checkout\n"
                              "  children:\n"
                              "    ps:\n      hosts:\n        ps0: {ansible_host: localhost}\n"
                              "    worker:\n      hosts:\n        worker0: {ansible_host: localhost}\n")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "deploy.yml and teardown.yml provision through: no slot" in proc.stdout
    assert proc.stdout.count("Skipped by deploy.yml and teardown.yml: tfcluster_deploy is false") == 2
    assert "stop.yml stops tasks through: ps0" in proc.stdout


# ------------------------------------------------------------ stop.yml on local slots (no SSH)

def test_stop_playbook_stops_tasks_of_local_slots(tmp_path):
    """Slots like inventory/local.yml's (local connection, tfcluster_deploy false, the checkout's
    agent and Python): stop.yml stops a detached run's tasks once per machine, changed only then."""
    import json
    inventory = tmp_path / "local.yml"
    inventory.write_text(
        "all:\n  vars:\n    ansible_connection: local\n"
        "    ansible_python_interpreter: \"{{ ansible_playbook_python }}\"\n"
        "    tfcluster_deploy: false\n    tfcluster_root: %s\n    tfcluster_python: %s\n"
        "    tfcluster_workdir: %s\n    tfcluster_port_base: %d\n  children:\n"
        "    ps:\n      hosts:\n        ps0: {ansible_host: localhost}\n"
        "    worker:\n      hosts:\n        worker0: {ansible_host: localhost}\n"
        # Free ports of this session's range: another session's launches use the rest.
        % (REPO, sys.executable, tmp_path / "work", free_port_block()))
    runs = str(tmp_path / "runs")
    tfcluster = [sys.executable, "-m", "tfcluster", "--runs-dir", runs]
    started = run(tfcluster + ["launch", "--cmd", "exec sleep 300", "-i", str(inventory),
                               "--ps", "0", "--detach", "--plain"])
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr
    (record,) = [json.load(open(os.path.join(runs, r, "run.json"))) for r in os.listdir(runs)]
    pid = record["tasks"]["worker:0"]["pid"]
    try:
        stop = run([_tool("ansible-playbook"), "-i", str(inventory), "playbooks/stop.yml"])
        assert stop.returncode == 0, stop.stdout[-4000:]
        assert re.search(r"^ps0\s+: ok=\d+\s+changed=1 ", stop.stdout, re.M), stop.stdout[-3000:]
        assert re.search(r"^worker0\s+: ok=\d+\s+changed=0 ", stop.stdout, re.M), stop.stdout[-3000:]
        assert "Stopped: worker-0" in stop.stdout
        wait_for(lambda: not pid_alive(pid), 30, "the stopped task to be gone")
        again = run([_tool("ansible-playbook"), "-i", str(inventory), "playbooks/stop.yml"])
        assert again.returncode == 0 and re.search(r"^ps0\s+: ok=\d+\s+changed=0 ", again.stdout, re.M)
    finally:
        run(tfcluster + ["stop", record["id"]])
