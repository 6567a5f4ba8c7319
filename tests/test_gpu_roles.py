"""The GPU roles' decisions, driven by fake GPU machines on this (GPU-less) machine.

Each scenario is a host alias with `ansible_connection: local` and its own folder: fake `lspci`,
`nvidia-smi`, `mokutil`, `modinfo` and `apt-cache` first on PATH (nvidia_driver_environment),
its own /proc/driver/nvidia/version (nvidia_driver_proc_version), facts folder, apt sources and
keyrings folders. One ansible-playbook run covers all of them: the whole nvidia_driver role in
--check (what it would install, refuse, reboot), then real runs of the parts that install no
package (the repository's files, the verify play).

What this proves: detection, the choices (flavour, pinning, fabric manager, Secure Boot, minimum
driver, reboot by state, per-machine GPU decision), the files written, and that the verify play
fails with the reason. What it cannot: that the packages exist and install, that the module
loads after the reboot, that a real GPU runs the matmul (docs/index.md, Limits).
"""
import grp
import json
import os
import pwd
import platform
import re
import shutil
import subprocess
import sys

import pytest

# One ansible-playbook run over 13 fake machines, one of them importing the real TensorFlow.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")

H100 = "NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)"
LOADED = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
          "(dvs-builder@U16-I1-N07-12-3)  Thu Sep 25 2025\nGCC version:  gcc version 12.2.0\n")

# name: (inventory variables, fake machine). Machine keys: gpus (lspci 3D controllers),
# nvswitch, gpu_name, secure_boot, installed (modinfo), loaded (/proc version file), smi (how
# many GPUs nvidia-smi lists), candidate (apt-cache's Debian driver), python (a fake interpreter
# for the verify play: its stdout and stderr).
# A machine in several groups detects once and runs each group's play: every Ansible module
# run costs about 0.4 CPU s, so scenarios that want the same machine share one.
V_OK_PYTHON = ('{"version": "2.21.0", "gpus": 2, "ran": [0, 1], "errors": {}}', "")
PLAN = {
    # NVSwitch machine, driver installed but not loaded: fabric manager at its version, a reboot;
    # the verify play then fails it as reboot pending.
    "hgx": ({}, {"gpus": 8, "nvswitch": 4, "installed": "580.95.05"}),
    # Installed and loaded: also the verify play's passing machine and the mirror's host.
    "proprietary": ({"nvidia_driver_flavour": "proprietary"}, {"gpus": 2, "installed": "580.95.05",
                                                               "loaded": LOADED, "python": V_OK_PYTHON}),
    "branch595": ({"nvidia_driver_branch": "595"},
                  {"gpus": 8, "nvswitch": 4, "gpu_name": "NVIDIA Corporation GB100 [B200] (rev a1)"}),
    "secureboot": ({}, {"gpus": 2, "secure_boot": True}),
    "debian535": ({"nvidia_driver_source": "debian"}, {"gpus": 2, "candidate": "535.247.01-1~deb12u1"}),
}
VERIFY = {
    "v_802": {"gpus": 8, "nvswitch": 4, "installed": "580.95.05", "loaded": LOADED, "python": (
        '{"version": "2.21.0", "gpus": 8, "ran": [], "errors": {"0": "InternalError: '
        'cudaGetDevice() failed. Status: system not yet initialized"}}',
        "E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:152] failed call to "
        "cuInit: CUDA_ERROR_SYSTEM_NOT_READY: system not yet initialized")},
    "v_lost": {"gpus": 2, "smi": 1, "installed": "580.95.05", "loaded": LOADED,
               "python": ('{"version": "2.21.0", "gpus": 1, "ran": [0], "errors": {}}', "")},
    # The real probe with this checkout's (CPU-only) TensorFlow: it finds no GPU to run on.
    "v_cpu_tf": {"gpus": 2, "installed": "580.95.05", "loaded": LOADED, "python": None},
}
ALSO_VERIFIED = ["proprietary", "hgx"]  # PLAN machines the verify play runs on too
MIRROR_HOST = "proprietary"


# The fake machines' files belong to whoever runs the tests: root need not.
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
         "nvidia_driver_file_owner": pwd.getpwuid(os.getuid()).pw_name,
         "nvidia_driver_file_group": grp.getgrgid(os.getgid()).gr_name}
KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----\nfake\n"


def executable(path, text):
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)


def fake_machine(folder, gpus=0, nvswitch=0, gpu_name=H100, secure_boot=False, installed=None,
                 loaded=None, smi=None, candidate=None, python=None):
    """The folder of one fake machine; returns its host variables."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    (folder / "sources").mkdir()
    lspci = ["00:02.0 VGA compatible controller: Intel Corporation UHD Graphics"]
    lspci += ["%02x:00.0 3D controller: %s" % (0x17 + i, gpu_name) for i in range(gpus)]
    lspci += ["%02x:00.0 Bridge: NVIDIA Corporation GH100 [H100 NVSwitch] (rev a1)" % (0x80 + i)
              for i in range(nvswitch)]
    executable(bin_dir / "lspci", "cat <<'EOF'\n%s\nEOF\n" % "\n".join(lspci))
    executable(bin_dir / "mokutil", "echo 'SecureBoot %s'\n" % ("enabled" if secure_boot else "disabled"))
    executable(bin_dir / "modinfo", "echo %s\n" % installed if installed else
               "echo 'modinfo: ERROR: Module nvidia not found.' >&2; exit 1\n")
    smi_count = gpus if smi is None else smi
    listing = "\n".join("GPU %d: NVIDIA H100 80GB HBM3 (UUID: GPU-%08d)" % (i, i) for i in range(smi_count))
    fabric = "\n".join("GPU 0000%02x:00.0\n    Fabric\n        State : Completed\n        Status : Success"
                       % (0x17 + i) for i in range(smi_count))
    executable(bin_dir / "nvidia-smi", 'case "$1" in\n-L) cat <<\'EOF\'\n%s\nEOF\n;;\n-q) cat <<\'EOF\'\n%s\nEOF\n;;\n'
               "esac\n" % (listing, fabric))
    if candidate:
        executable(bin_dir / "apt-cache", "printf 'Package: nvidia-driver\\nVersion: %s\\n'\n" % candidate)
    if loaded:
        (folder / "proc_version").write_text(loaded)
    variables = {
        "nvidia_driver_environment": {"PATH": "%s:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
                                               % bin_dir},
        "nvidia_driver_proc_version": str(folder / "proc_version"),
        "nvidia_driver_facts_dir": str(folder / "facts"),
        "nvidia_driver_apt_sources_dir": str(folder / "sources"),
        "nvidia_driver_keyrings_dir": str(folder / "keyrings"),
    }
    if python is not None:
        out, err = python
        executable(bin_dir / "fake-python", "cat <<'EOF'\n%s\nEOF\n"
                                            "cat >&2 <<'EOF'\n%s\nEOF\n" % (out, err))
        variables["nvidia_driver_verify_python"] = str(bin_dir / "fake-python")
    else:
        variables["nvidia_driver_verify_python"] = sys.executable
    return variables


def role_step(name, tasks_from=None, when=None):
    task = {"name": name, "ansible.builtin.include_role": {"name": "nvidia_driver"}}
    if tasks_from:
        task["ansible.builtin.include_role"]["tasks_from"] = tasks_from
    if when:
        task["when"] = when
    return task


DETECT = {"name": "Ensure the GPU fact is installed",
          "ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "detect.yml"},
          # Once per machine (a later play finds it done); include_role: the condition is the
          # include's, not each of its tasks'.
          "when": "_nvidia_driver_gpus is not defined"}


def play(name, hosts, *tasks):
    # The GPU fact's setup call gathers the `min` facts too.
    return {"name": name, "hosts": hosts, "gather_facts": False, "roles": ["tfcluster"],
            "tasks": [DETECT] + list(tasks)}


# One real run; nothing in it installs a package. Per machine, not per slot: validate.yml ORs
# every slot's tfcluster_gpu and deploy.yml decides from that and the GPU fact. The local
# machine's first slot is a ps with tfcluster_gpu false, its worker leaves it unset; the other
# machines (192.0.2.x) are only validated, never contacted.
PLAYBOOK = [
    {"name": "Validate the inventory", "ansible.builtin.import_playbook": REPO + "/playbooks/validate.yml"},
    play("Decide for the ps-first machine as deploy.yml does", "tfcluster_machines:&local",
         {"name": "Decide whether this machine gets the GPU stack", "ansible.builtin.set_fact": {
             "tfcluster_use_gpu": "{{ (_tfcluster_machine_gpu | bool) if _tfcluster_machine_gpu is not none"
                                  " else ((_nvidia_driver_gpus.count | default(0) | int) > 0) }}"}},
         role_step("Plan the NVIDIA driver on GPU machines", "plan.yml", "tfcluster_use_gpu | bool")),
    play("The driver plan (state, refusals, packages) and the reboot decision", "plan",
         role_step("Plan the NVIDIA driver", "plan.yml"), role_step("Decide on a reboot", "reboot.yml")),
    play("NVIDIA's repository from a mirror", "mirror",
         role_step("Ensure NVIDIA's apt repository is configured", "repository.yml")),
    play("The verify play", "verify", role_step("Ensure every GPU runs TensorFlow", "verify.yml")),
]

TASK = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(.+?)\] \**$")
RESULT = re.compile(r"^(ok|changed|skipping|fatal|failed): \[([^\]]+)\]")


def parse(output):
    """{(task, host): (status, result dict)} from the default callback's output."""
    results, task, decoder = {}, None, json.JSONDecoder()
    for match in re.finditer(r"^.*$", output, re.M):
        line = match.group(0)
        head = TASK.match(line)
        if head:
            task = head.group(1)
            continue
        found = RESULT.match(line)
        if not (found and task):
            continue
        result = {}
        arrow = line.find("=> {")
        if arrow >= 0:
            result, _ = decoder.raw_decode(output, match.start() + arrow + 3)
        results[(task, found.group(2))] = (found.group(1), result)
    return results


def inventory_hosts(root, scenarios):
    hosts = {}
    for name, (variables, machine) in scenarios.items():
        hosts[name] = dict(LOCAL, **fake_machine(root / name, **machine), **variables)
    return {"hosts": hosts}


def write_run(root):
    """Every fake machine, the inventory and the playbook under root; the argv to run."""
    mirror = root / "mirror"
    (mirror / "debian12" / "x86_64").mkdir(parents=True)
    (mirror / "debian12" / "x86_64" / "3bf863cc.pub").write_text(KEY)
    LOCAL["nvidia_driver_repo_base_url"] = "file://%s" % mirror
    slot = dict(LOCAL, **fake_machine(root / "psfirst", gpus=2))
    remote = {"ansible_host": "192.0.2.1"}
    inventory = {"all": {"children": {
        "ps": {"hosts": {"ps0": dict(slot, tfcluster_gpu=False), "p1": dict(remote, tfcluster_gpu=False),
                         "p2": {"ansible_host": "192.0.2.2", "tfcluster_gpu": False}}},
        "worker": {"hosts": {"worker0": slot, "w1": dict(remote, tfcluster_gpu=True)}},
        "local": {"hosts": {"ps0": {}, "worker0": {}}},
        "plan": inventory_hosts(root, PLAN),
        "verify": {"hosts": dict(inventory_hosts(root, {name: ({}, machine) for name, machine
                                                        in VERIFY.items()})["hosts"],
                                 **{name: {} for name in ALSO_VERIFIED})},
        "mirror": {"hosts": {MIRROR_HOST: {}}}}}}
    (root / "hosts.json").write_text(json.dumps(inventory))
    (root / "playbook.yml").write_text(json.dumps(PLAYBOOK))
    return [ANSIBLE_PLAYBOOK, "-i", str(root / "hosts.json"), str(root / "playbook.yml")]


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    """The ansible-playbook run over every scenario: (results, output), and the folder."""
    root = tmp_path_factory.mktemp("gpu")
    # Pipelining: one process per module on a local connection instead of four.
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_PIPELINING="1")
    proc = subprocess.run(write_run(root), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, stdin=subprocess.DEVNULL)
    yield (parse(proc.stdout), proc.stdout + proc.stderr), root
    shutil.rmtree(root, ignore_errors=True)


def repo_folder():
    """NVIDIA's folder for this machine's distribution and architecture, as the role names it."""
    release = dict(line.rstrip("\n").split("=", 1) for line in open("/etc/os-release") if "=" in line)
    name, version = release["ID"], release.get("VERSION_ID", "").strip('"')
    distro = name + (version.split(".")[0] if name == "debian" else version.replace(".", ""))
    return distro, "sbsa" if platform.machine() == "aarch64" else platform.machine()


def outcome(run, task, host):
    results, output = run
    assert (task, host) in results, "task %r did not run on %s:\n%s" % (task, host, output[-5000:])
    return results[(task, host)]


def plan_of(run, host):
    status, result = outcome(run, "nvidia_driver : Report the plan", host)
    return "\n".join(result["msg"])


def failure(run, task, host):
    status, result = outcome(run, task, host)
    assert status == "fatal", "%s on %s: %s, not failed" % (task, host, status)
    return result["msg"]


def test_gpu_stack_is_decided_per_machine(gpu_run):
    run = gpu_run[0]
    _, report = outcome(run, "Report the machines each playbook works on", "ps0")
    # 192.0.2.1: a ps (false) and a worker (true); 192.0.2.2: a ps (false); localhost: a ps
    # (false) listed first and a worker left unset.
    assert "GPU stack: 192.0.2.1:22 yes, 192.0.2.2:22 no, localhost if lspci finds GPUs" in report["msg"]
    # The ps slot provisions the machine, and still plans the driver for its worker's GPUs.
    assert outcome(run, "nvidia_driver : Report what lspci sees", "ps0")[1]["msg"].startswith("2 NVIDIA GPU(s)")
    assert "Packages: ['nvidia-open-580']" in plan_of(run, "ps0")
    assert ("nvidia_driver : Report the plan", "worker0") not in run[0]


@pytest.mark.parametrize("host, packages, fabric", [
    ("ps0", "['nvidia-open-580']", "no (no NVSwitch)"),
    ("proprietary", "['cuda-drivers-580']", "no (no NVSwitch)"),
    # From 590 the pinning package holds the branch; a Blackwell NVSwitch machine also gets nvlsm.
    ("branch595", "['nvidia-driver-pinning-595', 'nvidia-open']", "['nvidia-fabricmanager=595.*', 'nvlsm']"),
    # The fabric manager at exactly the installed driver's version.
    ("hgx", "['nvidia-open-580']", "['nvidia-fabricmanager-580=580.95.05-*']"),
])
def test_driver_flavour_branch_and_fabric_manager_are_planned(gpu_run, host, packages, fabric):
    plan = plan_of(gpu_run[0], host)
    assert "Packages: %s" % packages in plan
    assert "Fabric manager: %s" % fabric in plan


def test_secure_boot_stops_the_role_with_the_fix(gpu_run):
    run = gpu_run[0]
    message = failure(run, "nvidia_driver : Ensure Secure Boot will not block the driver's kernel module",
                      "secureboot")
    assert "Secure Boot is enabled (mokutil --sb-state)" in message
    assert "disable Secure Boot" in message and "nvidia_driver_secure_boot_key_enrolled: true" in message
    assert ("nvidia_driver : Report the plan", "secureboot") not in run[0]


def test_a_driver_too_old_for_tensorflow_is_refused(gpu_run):
    run = gpu_run[0]
    message = failure(run, "nvidia_driver : Ensure the driver is new enough for TensorFlow 2.21.0", "debian535")
    assert "driver 535.247.01 (debian) is older than 555.42.06" in message


def test_driver_installed_but_not_loaded_decides_a_reboot(gpu_run):
    run = gpu_run[0]
    # Installed (modinfo) but not loaded (no version file): the reboot is decided by state, and
    # the handler never reboots a machine reached through a local connection.
    status, result = outcome(run, "nvidia_driver : Decide whether a reboot must load the installed driver", "hgx")
    assert status == "changed"
    assert result["msg"].startswith("Reboot needed: driver 580.95.05 is installed, no nvidia module is loaded.")
    assert "reboot pending" in result["msg"]
    assert outcome(run, "nvidia_driver : Reboot to load the installed NVIDIA driver", "hgx")[0] == "skipping"
    # Installed and loaded: no reboot.
    status, result = outcome(run, "nvidia_driver : Decide whether a reboot must load the installed driver",
                             "proprietary")
    assert status == "ok" and result["msg"] == "Driver 580.95.05 installed and loaded."


def test_apt_source_is_written_from_the_mirror(gpu_run):
    root = gpu_run[1]
    distro, arch = repo_folder()
    keyring = root / MIRROR_HOST / "keyrings" / "nvidia-cuda.asc"
    source = (root / MIRROR_HOST / "sources" / "nvidia-cuda.sources").read_text()
    assert "\nTypes: deb\nURIs: file://%s/%s/%s/\nSuites: /\nSigned-By: %s\n" % (
        root / "mirror", distro, arch, keyring) in source
    assert keyring.read_text() == KEY


def test_verify_passes_when_every_gpu_ran_the_matmul(gpu_run):
    status, result = outcome(gpu_run[0], "nvidia_driver : Ensure every GPU ran the matmul", "proprietary")
    assert status == "ok" and result["msg"] == "proprietary: TensorFlow 2.21.0 ran a matmul on all 2 GPU(s)."


@pytest.mark.parametrize("host, task, reasons", [
    ("hgx", "Ensure the installed driver is the loaded one",
     ["reboot pending: driver 580.95.05 is installed but no nvidia module is loaded"]),
    ("v_lost", "Ensure every GPU ran the matmul",
     ["2 GPU(s) expected (lspci), nvidia-smi lists 1, TensorFlow 2.21.0 sees 1 and ran the matmul on 1."]),
    ("v_802", "Ensure every GPU ran the matmul",
     ["8 GPU(s) expected (lspci), nvidia-smi lists 8, TensorFlow 2.21.0 sees 8 and ran the matmul on 0.",
      "Status: system not yet initialized", "CUDA_ERROR_SYSTEM_NOT_READY",
      "the fabric manager must run at the driver's exact version"]),
    # This checkout's real TensorFlow (CPU-only) and the real probe: no GPU to run on.
    ("v_cpu_tf", "Ensure every GPU ran the matmul", ["2 GPU(s) expected (lspci), nvidia-smi lists 2, TensorFlow ",
                                                     " sees 0 and ran the matmul on 0."]),
])
def test_verify_fails_with_the_reason(gpu_run, host, task, reasons):
    message = failure(gpu_run[0], "nvidia_driver : " + task, host)
    for reason in reasons:
        assert reason in message, message
