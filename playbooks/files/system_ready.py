"""What an ordinary user's deploy needs from the administrator's half (docs/labs.md), checked
on a host without root. Standard library only: deploy.yml sends this file inline (python3 -c).

    system_ready.py JSON   (JSON: {"packages": [...], "python": PATH, "python_range": [MIN, MAX],
                           "gpu": bool, "nvidia_smi": PROGRAM, "min_driver": VERSION,
                           "root": tfcluster_root})
prints {"missing": [what the administrator's step must still do], "user": [what the user must
fix], "home": the user's home}.
"""
import json
import os
import subprocess
import sys


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
    code, out = run([python, "-c", "import sys, venv, ensurepip; "
                                   "print('%d.%d' % sys.version_info[:2])"])
    if code is None:
        return "no Python at %s (%s)" % (python, out)
    if code != 0:
        return "%s cannot make a venv (no venv/ensurepip: Debian's python3-venv)" % python
    found = version(out)
    if found is None or not version(lowest) <= found <= version(highest):
        return "Python %s at %s; TensorFlow needs %s to %s" % (out.strip(), python, lowest,
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


if __name__ == "__main__":
    print(json.dumps(check(json.loads(sys.argv[1]))))
