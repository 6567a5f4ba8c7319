"""The packed venv of an offline deploy: `tfcluster wheelhouse`'s pack metadata and cache, the
venv_pack.py the module venv_unpack runs (libzstd through ctypes) on a small fake venv, and (slow:
ansible-playbook on local hosts) the role's choice between the pack and pip in check mode and,
as root, the background unpack for real. The real pack on real hosts is
tests/test_dockerhosts.py's deploy."""
import argparse
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import tarfile

import pytest

from support.ansible_run import run_on_local_hosts, task_status_runs, task_statuses
from support import REPO
from tfcluster.deploy import packcache
from tfcluster.deploy import wheelhouse
from tfcluster.deploy import wheelpack

UNPACK = os.path.join(REPO, "plugins", "module_utils", "venv_pack.py")
PREFIX = "/build/.venv-pack-x/venv"


# The role's libzstd binding, as the wheelhouse loads it.
ZSTD = wheelpack.zstd(UNPACK)
TF_VERSION = wheelhouse.Content().tf_version()


def zstd_frame(data):
    out = io.BytesIO()
    ZSTD.compress(io.BytesIO(data), out.write, level=3, window_log=20, workers=0)
    return out.getvalue()


def fake_venv_archive(path, frames=1):
    """A tar.zst of a tiny venv built in PREFIX, as `tfcluster wheelhouse` packs one (split into
    FRAMES zstd frames one after the other, as `zstd` and `cat` could have made it)."""
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
    cut = len(data) // frames + 1
    with open(path, "wb") as handle:
        for start in range(0, len(data), cut):
            handle.write(zstd_frame(data[start:start + cut]))


def test_unpack_swaps_in_the_relocated_venv(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "old-file").write_text("from the previous install\n")
    archive = tmp_path / "venv.pack.tar.zst"
    fake_venv_archive(archive, frames=3)
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


def test_a_pack_built_under_umask_077_is_readable_by_every_user(tmp_path):
    """A venv built by someone whose umask is 077: the pack still lets other users run it (a
    lab's second user runs the first one's venv), and lets no one but root write it."""
    old = os.umask(0o077)
    try:
        venv = tmp_path / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "tool").write_text("#!/bin/sh\n")
        (venv / "bin" / "tool").chmod(0o700)
        (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    finally:
        os.umask(old)
    archive = tmp_path / "pack.tar.zst"
    assert wheelpack.pack_folder(str(venv), str(archive), ZSTD) is None
    raw = io.BytesIO()
    with open(archive, "rb") as handle:
        ZSTD.decompress(handle, raw.write)
    raw.seek(0)
    with tarfile.open(fileobj=raw) as tar:
        modes = {member.name: (member.mode, member.uid) for member in tar if not member.issym()}
    assert modes == {".": (0o755, 0), "./bin": (0o755, 0), "./bin/tool": (0o755, 0),
                     "./pyvenv.cfg": (0o644, 0)}, modes


def test_zstd_round_trip_over_many_buffers_and_workers():
    """More than one read buffer in and out, compressed by two worker threads as the pack is."""
    data = b"".join(b"%08d %s\n" % (i, os.urandom(8).hex().encode()) for i in range(400000))
    packed = io.BytesIO()
    ZSTD.compress(io.BytesIO(data), packed.write, level=3, window_log=27, workers=2)
    assert len(packed.getvalue()) < len(data)
    out = io.BytesIO()
    ZSTD.decompress(io.BytesIO(packed.getvalue()), lambda view: out.write(bytes(view)))
    assert out.getvalue() == data


@pytest.mark.slow
def test_zstd_works_in_a_process_that_imported_tensorflow():
    """libtensorflow_framework exports a zstd of its own: venv_pack's libzstd must still call its
    own functions (the test suite's process imports TensorFlow before the pack tests)."""
    program = (
        "import importlib.util, io, sys\n"
        "import tensorflow\n"
        "spec = importlib.util.spec_from_file_location('venv_pack', sys.argv[1])\n"
        "zstd = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(zstd)\n"
        "data, packed, out = b'tensorflow ' * 100000, io.BytesIO(), io.BytesIO()\n"
        "zstd.compress(io.BytesIO(data), packed.write, level=3, window_log=20, workers=2)\n"
        "zstd.decompress(io.BytesIO(packed.getvalue()), out.write)\n"
        "assert out.getvalue() == data\n"
        "print('round trip', len(packed.getvalue()))\n")
    proc = subprocess.run([sys.executable, "-c", program, UNPACK], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                                                TF_USE_LEGACY_KERAS="1"))  # no Keras 3: ~2 CPU s
    assert proc.returncode == 0 and "round trip" in proc.stdout, proc.stderr[-3000:]


def test_no_pack_without_libzstd(tmp_path, capsys, monkeypatch):
    def missing():
        raise ZSTD.ZstdError("libzstd.so.1 is not on this machine")
    monkeypatch.setattr(ZSTD, "libzstd", missing)
    assert wheelpack.build_pack(pack_args(tmp_path, "--pack-python", sys.executable)) == 0
    assert "no packed environment: libzstd.so.1" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(tmp_path, "wheelhouse", wheelpack.PACK_METADATA))


@pytest.mark.parametrize("damage", ["not tar", "not zstd", "cut short", "a byte changed"])
def test_unpack_of_a_broken_archive_leaves_the_old_venv(tmp_path, damage):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "tfcluster-installed").write_text("old record")
    archive = tmp_path / "venv.pack.tar.zst"
    fake_venv_archive(archive)
    whole = archive.read_bytes()
    payload = {"not tar": zstd_frame(b"not a tar archive" * 100), "not zstd": b"not zstd" * 100,
               "cut short": whole[:len(whole) // 2],
               # The frame's content checksum catches what the tar format would not.
               "a byte changed": whole[:len(whole) // 2] + bytes([whole[len(whole) // 2] ^ 1])
               + whole[len(whole) // 2 + 1:]}[damage]
    archive.write_bytes(payload)
    proc = subprocess.run([sys.executable, UNPACK, str(archive), str(venv), PREFIX, "# new"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "could not unpack" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert (venv / "tfcluster-installed").read_text() == "old record"
    assert sorted(os.listdir(tmp_path)) == ["venv"]


def pack_args(tmp_path, *extra):
    dest = tmp_path / "wheelhouse"
    dest.mkdir(exist_ok=True)
    for name in ("tensorflow_cpu-%s-cp311-cp311-manylinux_2_27_x86_64.whl"
                 % TF_VERSION, "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"):
        (dest / name).write_bytes(b"wheel " + name.encode())
    parser = wheelhouse.add_arguments(argparse.ArgumentParser())
    return wheelhouse.complete(parser.parse_args(["--dest", str(dest), *extra]), wheelhouse.Content())


def write_pack(args, base_python, **changes):
    """A pack's metadata and a small archive in args.dest, as build_pack leaves them."""
    archive = os.path.join(args.dest, wheelpack.PACK_ARCHIVE)
    fake_venv_archive(archive)
    metadata = {"base_python": base_python, "machine": platform.machine(),
                "format": wheelpack.PACK_FORMAT,
                "python_version": ".".join(map(str, sys.version_info[:3])),
                "inputs": wheelpack.pack_inputs(args, base_python), "prefix": PREFIX,
                "archive": wheelpack.PACK_ARCHIVE, "size": os.path.getsize(archive),
                "sha256": hashlib.sha256(open(archive, "rb").read()).hexdigest()}
    metadata.update(changes)
    with open(os.path.join(args.dest, wheelpack.PACK_METADATA), "w") as handle:
        json.dump(metadata, handle)
    return metadata


def test_pack_inputs_read_the_files_as_the_role_does(tmp_path):
    args = pack_args(tmp_path)
    inputs = wheelpack.pack_inputs(args, "/usr/bin/python3")
    assert inputs["packages"][0] == "tensorflow-cpu==" + TF_VERSION
    assert "numpy==2.4.6" in inputs["packages"] and inputs["no_deps"] == ["tf-keras"]
    assert not [p for p in inputs["packages"] + inputs["no_deps"] if "#" in p or p != p.strip()]
    assert inputs["wheels"] == sorted("%s %d" % (p.name, p.stat().st_size)
                                      for p in (tmp_path / "wheelhouse").iterdir())
    assert inputs["mode"] == "offline" and inputs["base_python"] == "/usr/bin/python3"


def test_a_pack_with_the_same_inputs_is_not_built_again(tmp_path, capsys):
    args = pack_args(tmp_path, "--pack-python", sys.executable)
    metadata = write_pack(args, sys.executable)
    before = os.stat(os.path.join(args.dest, wheelpack.PACK_ARCHIVE))
    assert wheelpack.build_pack(args) == 0
    assert "is up to date" in capsys.readouterr().out
    after = os.stat(os.path.join(args.dest, wheelpack.PACK_ARCHIVE))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert json.load(open(os.path.join(args.dest, wheelpack.PACK_METADATA))) == metadata


def test_no_pack_for_another_python_or_gpu_only(tmp_path, capsys):
    assert wheelpack.build_pack(pack_args(tmp_path, "--pack-python", "/nonexistent/python3")) == 0
    assert "does not run here" in capsys.readouterr().out
    assert wheelpack.build_pack(pack_args(tmp_path, "--pack-python", sys.executable,
                                           "--python-version", "3.2")) == 0
    assert "the wheels are for 3.2" in capsys.readouterr().out
    assert wheelpack.build_pack(pack_args(tmp_path, "--no-cpu", "--gpu")) == 0
    assert "install with pip" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(tmp_path, "wheelhouse", wheelpack.PACK_METADATA))


@pytest.mark.slow
def test_role_unpacks_a_matching_pack_and_falls_back_to_pip(tmp_path):
    """The tensorflow role in check mode on four local hosts: one whose Python and inputs the
    pack matches (pushed and unpacked, no pip), one with another Python version, one with a pack
    of an earlier format (gzip) and one whose controller wheelhouse gained a wheel after the pack
    was made (those three: pip, no pack)."""
    hosts = {}
    args = pack_args(tmp_path)
    for name, changes in (("match", {}), ("other_python", {"python_version": "3.0.0"}),
                          ("gzip_pack", {"format": None}), ("new_wheel", None)):
        # Each host's own pack (tensorflow_pack_metadata) in a folder of its own.
        pack_dir = tmp_path / ("pack-" + name)
        pack_dir.mkdir()
        metadata = write_pack(args, sys.executable, **(changes or {}))
        if changes is None:
            metadata["inputs"]["wheels"] = metadata["inputs"]["wheels"][1:]
        for path in (wheelpack.PACK_ARCHIVE, wheelpack.PACK_METADATA):
            os.rename(os.path.join(args.dest, path), pack_dir / path)
        (pack_dir / wheelpack.PACK_METADATA).write_text(json.dumps(metadata))
        root = tmp_path / ("root-" + name)
        # The host already holds the wheels: the check run needs no wheelhouse push.
        (root / "wheelhouse").mkdir(parents=True)
        for wheel in os.listdir(args.dest):
            (root / "wheelhouse" / wheel).write_bytes((tmp_path / "wheelhouse" / wheel).read_bytes())
        hosts[name] = "{tfcluster_root: %s, tensorflow_pack_metadata: %s}" % (
            root, pack_dir / "venv-pack.json")
    proc = run_on_local_hosts(tmp_path, hosts, "    - name: Install TensorFlow\n"
                              "      ansible.builtin.import_role:\n        name: tensorflow\n",
                              "--check")
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    status = task_statuses(proc.stdout)
    push = "tensorflow : Ensure the packed environment is on the host"
    pip = "tensorflow : Ensure the packages are installed in the venv"
    assert status.get((push, "match")) == "changed", proc.stdout[-5000:]
    assert status.get((pip, "match")) in (None, "skipping")
    for name in ("other_python", "gzip_pack", "new_wheel"):
        assert status.get((push, name)) in (None, "skipping"), name
        assert status.get((pip, name)) == "changed", (name, proc.stdout[-5000:])


@pytest.mark.root
@pytest.mark.slow
def test_background_unpack_is_waited_for_and_its_failure_fails_the_deploy(tmp_path):
    """For real on two local hosts, as deploy.yml runs it: the role starts the unpack in the
    background (tensorflow_unpack_wait: false), another task runs, then unpacked.yml waits. The
    good pack becomes the venv and leaves no job record; the damaged one fails the wait with the
    unpack's message, and that host's old venv stays."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the role makes the pushed archive root's")
    args = pack_args(tmp_path)
    sha256 = write_pack(args, sys.executable)["sha256"]
    hosts = {}
    for name in ("good", "damaged"):
        pack_dir = tmp_path / ("pack-" + name)
        pack_dir.mkdir()
        for path in (wheelpack.PACK_ARCHIVE, wheelpack.PACK_METADATA):
            (pack_dir / path).write_bytes((tmp_path / "wheelhouse" / path).read_bytes())
        root = tmp_path / ("root-" + name)
        (root / "venv").mkdir(parents=True)
        (root / "venv" / "tfcluster-installed").write_text("old record")
        hosts[name] = "{tfcluster_root: %s, tensorflow_pack_metadata: %s}" % (
            root, pack_dir / wheelpack.PACK_METADATA)
    archive = tmp_path / "pack-damaged" / wheelpack.PACK_ARCHIVE
    whole = archive.read_bytes()
    archive.write_bytes(whole[:len(whole) // 2])
    jobs = tmp_path / "async"
    proc = run_on_local_hosts(
        tmp_path, hosts,
        "    - name: Install TensorFlow\n      ansible.builtin.import_role:\n"
        "        name: tensorflow\n      vars:\n        tensorflow_unpack_wait: false\n"
        "    - name: Run beside the unpack\n      ansible.builtin.command: 'true'\n"
        "      changed_when: false\n"
        "    - name: Wait for the unpack\n      ansible.builtin.import_role:\n"
        "        name: tensorflow\n        tasks_from: unpacked.yml\n",
        env={"ANSIBLE_ASYNC_DIR": str(jobs)})
    output = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 2, output
    runs = task_status_runs(proc.stdout)
    wait = "tensorflow : Ensure the packed environment's unpack has finished"
    assert runs.get(("tensorflow : Ensure the packed environment is unpacked into the venv", "good")) \
        == ["changed"], output
    assert runs.get(("Run beside the unpack", "damaged")) == ["ok"], output
    # Skipped in the role, waited for after the other task.
    assert runs.get((wait, "good")) == ["skipping", "ok"], output
    assert runs.get((wait, "damaged")) == ["skipping", "fatal"], output
    assert "not a whole zstd archive (the archive ends in the middle of a frame)" in proc.stdout, output
    good, damaged = tmp_path / "root-good" / "venv", tmp_path / "root-damaged" / "venv"
    assert open(good / "bin" / "tool").readline() == "#!%s/bin/python\n" % good
    assert '"pack": "%s"' % sha256 in (good / "tfcluster-installed").read_text()
    assert (damaged / "tfcluster-installed").read_text() == "old record"
    assert not os.path.exists(str(damaged) + ".new")
    # The good host's job record was removed; the failed one's stays for a look (Ansible's way).
    assert len(os.listdir(jobs)) == 1, os.listdir(jobs)


def test_a_pack_in_the_cache_is_linked_not_built(tmp_path, capsys):
    """A second wheelhouse with the same inputs (another folder) gets the first's pack from the
    cache, as a link; one with other inputs does not."""
    cache = str(tmp_path / "cache")
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    first = pack_args(tmp_path / "one", "--pack-python", sys.executable, "--pack-cache", cache)
    metadata = write_pack(first, sys.executable)
    wanted = {key: metadata[key] for key in ("base_python", "python_version", "format", "machine",
                                             "inputs")}
    os.makedirs(cache)
    packcache.store(cache, wanted, first.dest, (wheelpack.PACK_ARCHIVE, wheelpack.PACK_METADATA))
    second = pack_args(tmp_path / "two", "--pack-python", sys.executable, "--pack-cache", cache)
    assert wheelpack.build_pack(second) == 0
    assert "copied from the pack cache" in capsys.readouterr().out
    for name in (wheelpack.PACK_ARCHIVE, wheelpack.PACK_METADATA):
        assert os.path.samefile(os.path.join(first.dest, name), os.path.join(second.dest, name))
    assert wheelpack.matching_pack(second.dest, wanted) == metadata
    # Another wheel list: another key, with nothing under it.
    with open(os.path.join(second.dest, "extra-1.0-py3-none-any.whl"), "w") as handle:
        handle.write("another input")
    other = packcache.entry(cache, dict(wanted, inputs=wheelpack.pack_inputs(second, sys.executable)))
    assert other != packcache.entry(cache, wanted) and not os.path.exists(other)


def test_a_second_wheelhouse_waits_for_the_cache_lock(tmp_path):
    cache = str(tmp_path / "cache")
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
             "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)")
    with packcache.locked(cache):
        held = subprocess.run([sys.executable, "-c", probe, os.path.join(cache, packcache.LOCK)],
                              capture_output=True, text=True, timeout=60)
        assert held.returncode != 0 and "BlockingIOError" in held.stderr, held.stderr
    free = subprocess.run([sys.executable, "-c", probe, os.path.join(cache, packcache.LOCK)],
                          capture_output=True, text=True, timeout=60)
    assert free.returncode == 0, free.stderr


def test_an_unusable_pack_cache_is_a_usage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = subprocess.run([sys.executable, "-m", "tfcluster", "wheelhouse", "--dest",
                           str(tmp_path / "wheelhouse"), "--pack-cache", str(blocker / "cache")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("tfcluster: error: the pack cache (--pack-cache or "
                                  "$TFCLUSTER_PACK_CACHE) %s cannot hold files" % (blocker / "cache"))
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not os.path.exists(tmp_path / "wheelhouse")  # no empty folder left behind
