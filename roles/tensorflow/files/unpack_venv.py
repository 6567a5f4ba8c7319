"""Install scripts/wheelhouse's packed venv on a host (the tensorflow role runs this with the host's
base interpreter):

    python3 unpack_venv.py ARCHIVE VENV BUILD_PREFIX RECORD

unpacks ARCHIVE (tar.gz) into a fresh VENV.new beside VENV, rewrites the build folder's path
(BUILD_PREFIX) to VENV in the venv's scripts (bin/: shebangs, activate) and pyvenv.cfg, writes
RECORD to VENV/tfcluster-installed, then swaps VENV.new in: an interrupted run leaves the old venv
or none, never half of one (the next deploy finds no record and installs again). ARCHIVE is
removed as soon as it is open. Python's zlib inflates about 1.6 times as fast as gzip(1), so this process
inflates and tar(1) writes the files beside it. Standard library only.
"""
import os
import shutil
import subprocess
import sys
import zlib


def unpack(archive, folder):
    tar = subprocess.Popen(["tar", "-x", "-f", "-", "-C", folder], stdin=subprocess.PIPE)
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    damage = None
    with open(archive, "rb") as source:
        # Gone from the folder at once (it stays readable here): pages never written back to
        # disk, and an interrupted run leaves no 400 MB behind.
        os.remove(archive)
        try:
            for chunk in iter(lambda: source.read(1 << 20), b""):
                while chunk:
                    tar.stdin.write(inflater.decompress(chunk))
                    # A gzip file may hold several members, one after the other.
                    chunk = inflater.unused_data if inflater.eof else b""
                    if inflater.eof:
                        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
            tar.stdin.write(inflater.flush())
        except zlib.error as error:
            damage = "not a whole gzip file (%s)" % error
        except BrokenPipeError:
            pass  # tar stopped early: its exit code says why
    try:
        tar.stdin.close()
    except BrokenPipeError:
        pass
    if tar.wait() != 0 or damage:
        sys.exit("tar could not unpack %s into %s: %s" % (archive, folder,
                                                           damage or "see tar's message above"))


def relocate(folder, old, new):
    """Rewrite the build folder's path in the venv's scripts and pyvenv.cfg (the .pyc files need
    nothing: Python puts the real source path in a code object it loads)."""
    bin_dir = os.path.join(folder, "bin")
    paths = [os.path.join(bin_dir, name) for name in os.listdir(bin_dir)]
    for path in paths + [os.path.join(folder, "pyvenv.cfg")]:
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as handle:
            data = handle.read()
        if old in data:
            with open(path, "r+b") as handle:
                handle.write(data.replace(old, new))
                handle.truncate()


def main(archive, venv, prefix, record):
    venv = os.path.normpath(venv)
    fresh, previous = venv + ".new", venv + ".old"
    for leftover in (fresh, previous):
        shutil.rmtree(leftover, ignore_errors=True)
    os.mkdir(fresh, 0o755)
    unpack(archive, fresh)
    relocate(fresh, os.fsencode(prefix), os.fsencode(venv))
    with open(os.path.join(fresh, "tfcluster-installed"), "wb") as handle:
        handle.write(os.fsencode(record))
    os.chmod(os.path.join(fresh, "tfcluster-installed"), 0o644)
    if os.path.lexists(venv):
        os.rename(venv, previous)
    os.rename(fresh, venv)
    shutil.rmtree(previous, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__.split("\n\n")[1].strip())
    main(*sys.argv[1:])
