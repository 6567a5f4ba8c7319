#!/usr/bin/python
"""What an ordinary user's deploy needs from the administrator's half (docs/labs.md), checked
on a host without root: deploy.yml runs this module before it changes anything."""

DOCUMENTATION = r"""
module: system_ready
short_description: Check what the administrator's half of a tfcluster deploy left on a host
description:
  - Reads, without root and without changing anything, whether the Debian packages, the Python
    the venv is made with, on GPU machines an NVIDIA driver new enough for TensorFlow, and a
    tfcluster_root this user can make are there.
  - Reports what is missing; the playbook decides whether to stop.
options:
  packages: {description: Debian packages that must be installed., type: list, elements: str, required: true}
  python: {description: Interpreter the venv is made with., type: str, required: true}
  python_range: {description: Lowest and highest Python version TensorFlow supports., type: list, elements: str, required: true}
  gpu: {description: Whether the machine gets the GPU stack., type: bool, default: false}
  nvidia_smi: {description: The driver's query tool., type: str, default: nvidia-smi}
  min_driver: {description: Lowest NVIDIA driver version TensorFlow needs., type: str, default: "0"}
  root: {description: The tfcluster_root this user must be able to make., type: str, required: true}
author: [tfcluster developers]
"""

RETURN = r"""
missing: {description: What the administrator's half must still do., type: list, elements: str, returned: always}
user: {description: What the user must fix (a tfcluster_root they cannot make)., type: list, elements: str, returned: always}
home: {description: The user's home., type: str, returned: always}
"""

import os
import subprocess

from ansible.module_utils.basic import AnsibleModule


def version(text):
    """'555.42.06' -> (555, 42, 6); None when it is no version."""
    try:
        return tuple(int(part) for part in text.strip().split("."))
    except ValueError:
        return None


def run(argv):
    """(exit code, output) of a read-only command; (None, why) when it cannot run."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=60)
    except OSError as error:
        return None, error.strerror
    except subprocess.TimeoutExpired:
        return None, "no answer within 60 s"
    return proc.returncode, proc.stdout


def missing_packages(packages):
    """The Debian packages of PACKAGES that dpkg does not have installed."""
    code, out = run(["dpkg-query", "--show", "--showformat=${Package} ${db:Status-Status}\\n",
                     "--"] + list(packages))
    if code is None:
        return []  # no dpkg: not a Debian host, which the deploy refuses on its own
    installed = {line.split()[0] for line in out.splitlines() if line.endswith(" installed")}
    return [name for name in packages if name not in installed]


def python_problem(python, lowest, highest):
    code, out = run([python, "--version"])  # "Python 3.11.2"
    if code is None:
        return "no Python at %s (%s)" % (python, out)
    if code != 0 or run([python, "-m", "ensurepip", "--version"])[0] != 0:
        return "%s cannot make a venv (no venv/ensurepip: Debian's python3-venv)" % python
    major_minor = ".".join(out.split()[-1].split(".")[:2]) if out.split() else out
    found = version(major_minor)
    if found is None or not version(lowest) <= found <= version(highest):
        return "Python %s at %s; TensorFlow needs %s to %s" % (major_minor, python, lowest,
                                                               highest)
    return None


def driver_problem(nvidia_smi, lowest):
    code, out = run([nvidia_smi, "--query-gpu=driver_version", "--format=csv,noheader,nounits"])
    if code is None or code != 0 or not out.strip():
        return "no NVIDIA driver (%s does not answer)" % nvidia_smi
    found = out.split()[0]
    if version(found) is None or version(found) < version(lowest):
        return "NVIDIA driver %s, older than the %s TensorFlow needs" % (found, lowest)
    return None


def writable_problem(root):
    """Why this user cannot make ROOT (the nearest folder that exists is not theirs to write)."""
    folder = root
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    if os.access(folder, os.W_OK | os.X_OK):
        return None
    return "tfcluster_root %s cannot be made here: %s is not writable" % (root, folder)


def check(wanted):
    missing = []
    packages = missing_packages(wanted["packages"])
    if packages:
        missing.append("Debian package(s) %s not installed" % ", ".join(packages))
    problem = python_problem(wanted["python"], *wanted["python_range"])
    if problem and not packages:  # a missing python3-venv is that already
        missing.append(problem)
    if wanted["gpu"]:
        problem = driver_problem(wanted["nvidia_smi"], wanted["min_driver"])
        if problem:
            missing.append(problem)
    problem = writable_problem(wanted["root"])
    return {"missing": missing, "user": [problem] if problem else [],
            "home": os.path.expanduser("~")}


def main():
    module = AnsibleModule(argument_spec={
        "packages": {"type": "list", "elements": "str", "required": True},
        "python": {"type": "str", "required": True},
        "python_range": {"type": "list", "elements": "str", "required": True},
        "gpu": {"type": "bool", "default": False},
        "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
        "min_driver": {"type": "str", "default": "0"},
        "root": {"type": "str", "required": True},
    }, supports_check_mode=True)
    module.exit_json(changed=False, **check(module.params))


if __name__ == "__main__":
    main()
