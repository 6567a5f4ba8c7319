"""tfcluster as a user installs it: the wheel built from this checkout, installed in a venv
outside it, run from a folder of its own (tests/test_collection.py, tests/test_dockerhosts.py)."""
import glob
import os
import subprocess
import sys

from support import REPO


def build_wheel(folder):
    """The wheel's path, built from this checkout as `pip wheel` does (isolated build)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           folder, REPO], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The metadata is current: no setuptools deprecation notice.
    assert "eprecat" not in proc.stdout + proc.stderr, proc.stderr
    (path,) = glob.glob(os.path.join(folder, "tfcluster-*.whl"))
    return path


def install_wheel(wheel, base):
    """(python, site-packages, work folder): a venv in BASE with WHEEL installed.

    The wheel goes in with --no-deps; its dependencies (ansible-core, TensorFlow...) are read
    from this test's own venv through a .pth line, which adds the folder without running its
    .pth files, so the checkout's editable tfcluster stays out: what runs is the wheel's."""
    venv = os.path.join(base, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    with open(os.path.join(site, "zz-test-dependencies.pth"), "w") as handle:
        handle.write("\n".join(deps) + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                           site, wheel], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # The venv's own `tfcluster` command, as pip writes it (pip --target puts its scripts
    # beside site-packages, for the Python pip runs on).
    script = os.path.join(venv, "bin", "tfcluster")
    with open(script, "w") as handle:
        handle.write("#!%s\nimport sys\nfrom tfcluster.cli.main import main\nsys.exit(main())\n" % python)
    os.chmod(script, 0o755)
    work = os.path.join(base, "work")
    os.makedirs(work)
    return python, site, work


def run_installed(python, work, *argv, timeout=300, env=None):
    """PYTHON ARGV in WORK, with none of this session's Ansible settings."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    environ.update(ANSIBLE_NOCOLOR="1", PYTHONPATH="", PWD=work)  # as a shell sets PWD
    environ.update(env or {})
    return subprocess.run([python, *argv], cwd=work, env=environ, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
