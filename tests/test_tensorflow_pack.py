"""The packed venv of an offline deploy: scripts/wheelhouse's pack metadata and cache, the
tensorflow role's unpack_venv.py on a small fake venv, and (slow: ansible-playbook in check mode
on local hosts) the role's choice between the pack and pip. The real pack on real hosts is
tests/test_dockerhosts.py's deploy."""
import gzip
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import os
import platform
import subprocess
import sys
import tarfile

import pytest

from ansible_run import ansible_tool, task_statuses
from conftest import REPO

UNPACK = os.path.join(REPO, "roles", "tensorflow", "files", "unpack_venv.py")
PREFIX = "/build/.venv-pack-x/venv"


def load_wheelhouse():
    loader = importlib.machinery.SourceFileLoader(
        "_wheelhouse_script", os.path.join(REPO, "scripts", "wheelhouse"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


wheelhouse = load_wheelhouse()


def fake_venv_archive(path, members=1):
    """A tar.gz of a tiny venv built in PREFIX, as scripts/wheelhouse packs one (MEMBERS gzip
    members one after the other, as a parallel gzip writes)."""
    files = {
        "bin/tool": ("#!%s/bin/python\nimport sys\n" % PREFIX, 0o755),
        "bin/activate": ('VIRTUAL_ENV="%s"\nexport VIRTUAL_ENV\n' % PREFIX, 0o644),
        "pyvenv.cfg": ("home = /usr/bin\nversion = 3.11.2\ncommand = /usr/bin/python3 -m venv %s\n"
                       % PREFIX, 0o644),
        "lib/python3.11/site-packages/mod.py": ("X = 1\n", 0o644),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, (text, mode) in files.items():
            info = tarfile.TarInfo("./" + name)
            info.size, info.mode = len(text), mode
            tar.addfile(info, io.BytesIO(text.encode()))
        link = tarfile.TarInfo("./bin/python")
        link.type, link.linkname = tarfile.SYMTYPE, sys.executable
        tar.addfile(link)
    data = raw.getvalue()
    cut = len(data) // members + 1
    with open(path, "wb") as handle:
        for start in range(0, len(data), cut):
            handle.write(gzip.compress(data[start:start + cut]))


def test_unpack_swaps_in_the_relocated_venv(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "old-file").write_text("from the previous install\n")
    archive = tmp_path / "venv.pack.tar.gz"
    fake_venv_archive(archive, members=3)
    proc = subprocess.run([sys.executable, UNPACK, str(archive), str(venv), PREFIX, "# record"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (venv / "bin" / "tool").read_text().startswith("#!%s/bin/python\n" % venv)
    assert os.access(venv / "bin" / "tool", os.X_OK)
    assert 'VIRTUAL_ENV="%s"' % venv in (venv / "bin" / "activate").read_text()
    assert (venv / "pyvenv.cfg").read_text().endswith("-m venv %s\n" % venv)
    assert os.readlink(venv / "bin" / "python") == sys.executable
    assert (venv / "tfcluster-installed").read_text() == "# record"
    assert (venv / "lib/python3.11/site-packages/mod.py").read_text() == "X = 1\n"
    # The old venv is gone whole, and so are the pushed archive and the work folders.
    assert not (venv / "old-file").exists()
    assert sorted(os.listdir(tmp_path)) == ["venv"]


@pytest.mark.parametrize("payload", [gzip.compress(b"not a tar archive" * 100),
                                     b"not even gzip" * 100])
def test_unpack_of_a_broken_archive_leaves_the_old_venv(tmp_path, payload):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "tfcluster-installed").write_text("old record")
    archive = tmp_path / "venv.pack.tar.gz"
    archive.write_bytes(payload)
    proc = subprocess.run([sys.executable, UNPACK, str(archive), str(venv), PREFIX, "# new"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "could not unpack" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert (venv / "tfcluster-installed").read_text() == "old record"


def pack_args(tmp_path, *extra):
    dest = tmp_path / "wheelhouse"
    dest.mkdir(exist_ok=True)
    for name in ("tensorflow_cpu-%s-cp311-cp311-manylinux_2_27_x86_64.whl"
                 % wheelhouse.default_tf_version(), "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"):
        (dest / name).write_bytes(b"wheel " + name.encode())
    return wheelhouse.build_parser().parse_args(["--dest", str(dest), *extra])


def write_pack(args, base_python, **changes):
    """A pack's metadata and a small archive in args.dest, as build_pack leaves them."""
    archive = os.path.join(args.dest, wheelhouse.PACK_ARCHIVE)
    fake_venv_archive(archive)
    metadata = {"base_python": base_python, "machine": platform.machine(),
                "python_version": ".".join(map(str, sys.version_info[:3])),
                "inputs": wheelhouse.pack_inputs(args, base_python), "prefix": PREFIX,
                "archive": wheelhouse.PACK_ARCHIVE, "size": os.path.getsize(archive),
                "sha256": hashlib.sha256(open(archive, "rb").read()).hexdigest()}
    metadata.update(changes)
    with open(os.path.join(args.dest, wheelhouse.PACK_METADATA), "w") as handle:
        json.dump(metadata, handle)
    return metadata


def test_pack_inputs_read_the_files_as_the_role_does(tmp_path):
    args = pack_args(tmp_path)
    inputs = wheelhouse.pack_inputs(args, "/usr/bin/python3")
    assert inputs["packages"][0] == "tensorflow-cpu==" + wheelhouse.default_tf_version()
    assert "numpy==2.4.6" in inputs["packages"] and inputs["no_deps"] == ["tf-keras"]
    assert not [p for p in inputs["packages"] + inputs["no_deps"] if "#" in p or p != p.strip()]
    assert inputs["wheels"] == sorted("%s %d" % (p.name, p.stat().st_size)
                                      for p in (tmp_path / "wheelhouse").iterdir())
    assert inputs["mode"] == "offline" and inputs["base_python"] == "/usr/bin/python3"


def test_a_pack_with_the_same_inputs_is_not_built_again(tmp_path, capsys):
    args = pack_args(tmp_path, "--pack-python", sys.executable)
    metadata = write_pack(args, sys.executable)
    before = os.stat(os.path.join(args.dest, wheelhouse.PACK_ARCHIVE))
    assert wheelhouse.build_pack(args) == 0
    assert "is up to date" in capsys.readouterr().out
    after = os.stat(os.path.join(args.dest, wheelhouse.PACK_ARCHIVE))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert json.load(open(os.path.join(args.dest, wheelhouse.PACK_METADATA))) == metadata


def test_no_pack_for_another_python_or_gpu_only(tmp_path, capsys):
    assert wheelhouse.build_pack(pack_args(tmp_path, "--pack-python", "/nonexistent/python3")) == 0
    assert "does not run here" in capsys.readouterr().out
    assert wheelhouse.build_pack(pack_args(tmp_path, "--pack-python", sys.executable,
                                           "--python-version", "3.2")) == 0
    assert "the wheels are for 3.2" in capsys.readouterr().out
    assert wheelhouse.build_pack(pack_args(tmp_path, "--no-cpu", "--gpu")) == 0
    assert "install with pip" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(tmp_path, "wheelhouse", wheelhouse.PACK_METADATA))


@pytest.mark.slow
def test_role_unpacks_a_matching_pack_and_falls_back_to_pip(tmp_path):
    """The tensorflow role in check mode on three local hosts: one whose Python and inputs the
    pack matches (pushed and unpacked, no pip), one with another Python version and one whose
    controller wheelhouse gained a wheel after the pack was made (both: pip, no pack)."""
    hosts = {}
    args = pack_args(tmp_path)
    for name, changes in (("match", {}), ("other_python", {"python_version": "3.0.0"}),
                          ("new_wheel", None)):
        # Each host's own pack (tensorflow_pack_metadata) in a folder of its own.
        pack_dir = tmp_path / ("pack-" + name)
        pack_dir.mkdir()
        metadata = write_pack(args, sys.executable, **(changes or {}))
        if changes is None:
            metadata["inputs"]["wheels"] = metadata["inputs"]["wheels"][1:]
        for path in (wheelhouse.PACK_ARCHIVE, wheelhouse.PACK_METADATA):
            os.rename(os.path.join(args.dest, path), pack_dir / path)
        (pack_dir / wheelhouse.PACK_METADATA).write_text(json.dumps(metadata))
        root = tmp_path / ("root-" + name)
        # The host already holds the wheels: the check run needs no wheelhouse push.
        (root / "wheelhouse").mkdir(parents=True)
        for wheel in os.listdir(args.dest):
            (root / "wheelhouse" / wheel).write_bytes((tmp_path / "wheelhouse" / wheel).read_bytes())
        hosts[name] = "{tfcluster_root: %s, tensorflow_pack_metadata: %s}" % (
            root, pack_dir / "venv-pack.json")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  vars:\n    ansible_connection: local\n"
        "    ansible_python_interpreter: %s\n  hosts:\n%s"
        % (sys.executable, "".join("    %s: %s\n" % item for item in hosts.items())))
    playbook = tmp_path / "install.yml"
    playbook.write_text(
        "- name: Install TensorFlow\n  hosts: all\n  gather_subset: [min]\n  roles: [tfcluster]\n"
        "  tasks:\n    - name: Install TensorFlow\n      ansible.builtin.import_role:\n"
        "        name: tensorflow\n")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_ROLES_PATH=os.path.join(REPO, "roles"))
    proc = subprocess.run([ansible_tool("ansible-playbook"), "-i", str(inventory), str(playbook),
                           "--check", "-e", "tfcluster_src=" + REPO,
                           "-e", "tensorflow_install_mode=offline",
                           "-e", "tensorflow_wheelhouse_src=%s" % (tmp_path / "wheelhouse")],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    status = task_statuses(proc.stdout)
    push = "tensorflow : Ensure the packed environment is on the host"
    pip = "tensorflow : Ensure the packages are installed in the venv"
    assert status.get((push, "match")) == "changed", proc.stdout[-5000:]
    assert status.get((pip, "match")) in (None, "skipping")
    for name in ("other_python", "new_wheel"):
        assert status.get((push, name)) in (None, "skipping"), name
        assert status.get((pip, name)) == "changed", (name, proc.stdout[-5000:])
