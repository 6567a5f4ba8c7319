"""Install scripts/wheelhouse's packed venv on a host (the tensorflow role runs it as the module
venv_unpack; by hand, with any Python 3):

    python3 venv_pack.py ARCHIVE VENV BUILD_PREFIX RECORD

unpacks ARCHIVE (tar.zst) into a fresh VENV.new beside VENV, rewrites the build folder's path
(BUILD_PREFIX) to VENV in the venv's scripts (bin/: shebangs, activate) and pyvenv.cfg, writes
RECORD to VENV/tfcluster-installed, then swaps VENV.new in: an interrupted run leaves the old venv
or none, never half of one (the next deploy finds no record and installs again). ARCHIVE is
removed as soon as it is open. This process inflates with libzstd (through ctypes: every Debian
and Ubuntu has libzstd1, which dpkg and apt need; few have the zstd command) and tar(1) writes
the files beside it. scripts/wheelhouse packs with `compress` below. Standard library only.
"""
import ctypes
import functools
import os
import shutil
import subprocess
import sys

# zstd.h's stable API (libzstd 1.4+).
C_COMPRESSION_LEVEL, C_WINDOW_LOG, C_CHECKSUM_FLAG = 100, 101, 201
C_ENABLE_LONG_DISTANCE_MATCHING, C_NB_WORKERS = 160, 400
E_CONTINUE, E_END = 0, 2
CHUNK = 1 << 22


class Buffer(ctypes.Structure):
    """ZSTD_inBuffer and ZSTD_outBuffer: the same three fields."""
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t)]


class ZstdError(Exception):
    pass


class UnpackError(Exception):
    """The pack could not be installed; the message says why."""


@functools.lru_cache(maxsize=None)  # loaded and typed once; a failure is not remembered
def libzstd():
    # DEEPBIND: libzstd calls its own exported functions. In a process where another zstd is
    # in the global scope (after `import tensorflow`: libtensorflow_framework exports its own
    # ZSTD_*), those calls would land in that copy, whose structures differ, and fail.
    try:
        lib = ctypes.CDLL("libzstd.so.1", mode=ctypes.DEFAULT_MODE | getattr(os, "RTLD_DEEPBIND", 0))
    except OSError:
        raise ZstdError("libzstd.so.1 is not on this machine (Debian and Ubuntu: apt install libzstd1)")
    size_t, pointer = ctypes.c_size_t, ctypes.c_void_p
    for name, result, args in (
            ("ZSTD_createDCtx", pointer, []), ("ZSTD_freeDCtx", size_t, [pointer]),
            ("ZSTD_decompressStream", size_t, [pointer, pointer, pointer]),
            ("ZSTD_createCCtx", pointer, []), ("ZSTD_freeCCtx", size_t, [pointer]),
            ("ZSTD_CCtx_setParameter", size_t, [pointer, ctypes.c_int, ctypes.c_int]),
            ("ZSTD_compressStream2", size_t, [pointer, pointer, pointer, ctypes.c_int]),
            ("ZSTD_isError", ctypes.c_uint, [size_t]),
            ("ZSTD_getErrorName", ctypes.c_char_p, [size_t])):
        function = getattr(lib, name)
        function.restype, function.argtypes = result, args
    return lib


def checked(lib, code):
    if lib.ZSTD_isError(code):
        raise ZstdError(lib.ZSTD_getErrorName(code).decode())
    return code


def decompress(source, write):
    """Inflate the zstd stream SOURCE (a binary file) into WRITE, one buffer at a time."""
    lib = libzstd()
    context = lib.ZSTD_createDCtx()
    out = ctypes.create_string_buffer(CHUNK)
    view = memoryview(out)
    pending = 0
    try:
        for chunk in iter(lambda: source.read(CHUNK), b""):
            given = Buffer(ctypes.cast(ctypes.c_char_p(chunk), ctypes.c_void_p), len(chunk), 0)
            # zstd keeps a frame's last byte until all of the frame's output is out.
            while given.pos < given.size:
                taken = Buffer(ctypes.addressof(out), CHUNK, 0)
                pending = checked(lib, lib.ZSTD_decompressStream(
                    context, ctypes.byref(taken), ctypes.byref(given)))
                write(view[:taken.pos])
        if pending:
            raise ZstdError("the archive ends in the middle of a frame")
    finally:
        lib.ZSTD_freeDCtx(context)


def compress(source, write, level, window_log, workers):
    """Compress SOURCE (a binary file) into WRITE as one zstd frame with a content checksum;
    long-distance matching over 2**WINDOW_LOG bytes (decoders accept up to 2**27 unasked)."""
    lib = libzstd()
    context = lib.ZSTD_createCCtx()
    out = ctypes.create_string_buffer(CHUNK)
    view = memoryview(out)
    try:
        for parameter, value in ((C_COMPRESSION_LEVEL, level), (C_CHECKSUM_FLAG, 1),
                                 (C_WINDOW_LOG, window_log), (C_ENABLE_LONG_DISTANCE_MATCHING, 1),
                                 (C_NB_WORKERS, workers)):
            checked(lib, lib.ZSTD_CCtx_setParameter(context, parameter, value))
        while True:
            chunk = source.read(CHUNK)
            mode = E_CONTINUE if chunk else E_END
            given = Buffer(ctypes.cast(ctypes.c_char_p(chunk), ctypes.c_void_p), len(chunk), 0)
            while True:
                taken = Buffer(ctypes.addressof(out), CHUNK, 0)
                left = checked(lib, lib.ZSTD_compressStream2(
                    context, ctypes.byref(taken), ctypes.byref(given), mode))
                write(view[:taken.pos])
                if (left == 0) if mode == E_END else (given.pos == given.size):
                    break
            if mode == E_END:
                return
    finally:
        lib.ZSTD_freeCCtx(context)


def unpack(archive, folder):
    tar = subprocess.Popen(["tar", "-x", "-f", "-", "-C", folder], stdin=subprocess.PIPE)
    damage = None
    with open(archive, "rb") as source:
        # Gone from the folder at once (it stays readable here): pages never written back to
        # disk, and an interrupted run leaves no 300 MB behind.
        os.remove(archive)
        try:
            decompress(source, tar.stdin.write)
        except ZstdError as error:
            damage = "not a whole zstd archive (%s)" % error
        except BrokenPipeError:
            pass  # tar stopped early: its exit code says why
    try:
        tar.stdin.close()
    except BrokenPipeError:
        pass
    if tar.wait() != 0 or damage:
        raise UnpackError("tar could not unpack %s into %s: %s" % (
            archive, folder, damage or "see tar's message above"))


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
    try:
        libzstd()
    except ZstdError as error:
        raise UnpackError("cannot unpack %s: %s" % (archive, error)) from None
    os.mkdir(fresh, 0o755)
    try:
        unpack(archive, fresh)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)  # a half-written venv is only disk used
        raise
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
    try:
        main(*sys.argv[1:])
    except UnpackError as error:
        sys.exit(str(error))
