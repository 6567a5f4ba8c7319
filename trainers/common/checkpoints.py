"""Checkpoints that are never half-written. Every save of every trainer goes through commit(),
every resume through latest(). Host side: the standard library only (TensorFlow only in
ObjectCheckpoints, handed in).

A checkpoint folder (--checkpoint_dir) holds:

    ckpt-000000120/     a complete checkpoint of global step 120: the files the save wrote and
                        MANIFEST.json (format, step, entry, each file's size and sha256)
    .partial-120-xxxx/  a save under way, or one a crash cut off: never read, removed by the
                        next commit

A save writes its files into a .partial folder beside the others, hashes them into the
manifest, fsyncs files, manifest and folder, and only then renames the folder to ckpt-<step>
(one rename: a reader sees no checkpoint of that step, or a whole one) and fsyncs the parent.
A resume takes the newest folder whose manifest verifies (every file there, of its size and
hash) and falls back to the one before when it does not.
"""
import json
import os
import shutil
import tempfile

from tfcluster_agent.hostcode import file_sha256

MANIFEST = "MANIFEST.json"
COMPLETE = "ckpt-"
PARTIAL = ".partial-"
FORMAT = 1
KEEP = 2  # complete checkpoints kept: the newest and the one a resume falls back to


class Found:
    """A complete checkpoint: its FOLDER, STEP, and ENTRY (the path its restorer reads: the
    folder's file prefix, e.g. .../ckpt-000000120/model.ckpt-120)."""

    def __init__(self, folder, step, entry):
        self.folder, self.step, self.entry = folder, step, entry

    def __repr__(self):
        return "Found(%r, step=%d)" % (self.folder, self.step)


def folder_name(step):
    return "%s%09d" % (COMPLETE, int(step))


def commit(directory, step, write, keep=KEEP):
    """Save checkpoint STEP into DIRECTORY, atomically: WRITE(folder) writes its files into a
    new folder and returns the entry name its restorer reads (a file prefix, relative to the
    folder). Returns the Found of the committed checkpoint; the older ones beyond KEEP and the
    leftovers of saves cut off are removed."""
    os.makedirs(directory, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="%s%d-" % (PARTIAL, int(step)), dir=directory)
    final = os.path.join(directory, folder_name(step))
    try:
        entry = os.path.relpath(write(staging), staging)
        files = {}
        for name in sorted(_files(staging)):
            path = os.path.join(staging, name)
            files[name] = {"size": os.path.getsize(path), "sha256": file_sha256(path)}
            _fsync_file(path)
        _write_synced(os.path.join(staging, MANIFEST), json.dumps(
            {"format": FORMAT, "step": int(step), "entry": entry, "files": files},
            indent=1, sort_keys=True))
        _fsync_dir(staging)
        if os.path.exists(final):  # the same step saved again: the new one replaces it
            os.rename(final, tempfile.mkdtemp(prefix="%sold-" % PARTIAL, dir=directory))
        os.rename(staging, final)
        _fsync_dir(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    prune(directory, keep)
    return Found(final, int(step), os.path.join(final, entry))


def prune(directory, keep=KEEP):
    """Remove the complete checkpoints older than the KEEP newest, and every .partial folder:
    one writer commits into a folder (the chief; preflight refuses a second run), and it calls
    this only between saves."""
    for name in os.listdir(directory):
        if name.startswith(PARTIAL):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    for _, name in sorted(_complete_names(directory), reverse=True)[keep:]:
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def latest(directory, log=None):
    """The newest complete checkpoint of DIRECTORY (a Found), or None; each newer one that
    does not verify is named to LOG(message) and passed over."""
    if not directory or not os.path.isdir(directory):
        return None
    for step, name in sorted(_complete_names(directory), reverse=True):
        folder = os.path.join(directory, name)
        problem, entry = verify(folder)
        if problem is None:
            return Found(folder, step, os.path.join(folder, entry))
        if log is not None:
            log("checkpoint %s is not complete (%s): passed over" % (folder, problem))
    return None


def verify(folder):
    """(None, entry) when FOLDER's manifest holds and every file it lists is there with its
    size and hash; else (what is wrong, None)."""
    try:
        with open(os.path.join(folder, MANIFEST)) as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        return "no %s" % MANIFEST, None
    except (OSError, ValueError) as err:
        return "unreadable %s: %s" % (MANIFEST, err), None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or \
            not isinstance(manifest.get("files"), dict) or \
            not isinstance(manifest.get("entry"), str):
        return "%s of an unknown form" % MANIFEST, None
    for name, expected in sorted(manifest["files"].items()):
        path = os.path.join(folder, name)
        try:
            size = os.path.getsize(path)
        except OSError:
            return "%s missing" % name, None
        if size != expected.get("size"):
            return "%s has %d bytes, not %s" % (name, size, expected.get("size")), None
        if file_sha256(path) != expected.get("sha256"):
            return "%s does not match its hash" % name, None
    return None, manifest["entry"]


def _complete_names(directory):
    """(step, name) of DIRECTORY's ckpt-<step> folders."""
    found = []
    for name in os.listdir(directory):
        digits = name[len(COMPLETE):]
        if name.startswith(COMPLETE) and digits.isdigit():
            found.append((int(digits), name))
    return found


def _files(folder):
    for root, _, names in os.walk(folder):
        for name in names:
            yield os.path.relpath(os.path.join(root, name), folder)


def _fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path, text):
    with open(path, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


# ---------------------------------------------------------------- TensorFlow's two formats

def save_graph(sess, saver, directory, step):
    """A graph-mode (tf.compat.v1) Saver's checkpoint of SESS at global step STEP, committed
    into DIRECTORY; its Found. The Saver writes neither its state file nor a meta graph: the
    manifest says what is complete, and the program builds its graph itself."""
    return commit(directory, step, lambda folder: saver.save(
        sess, os.path.join(folder, "model.ckpt"), global_step=int(step),
        write_meta_graph=False, write_state=False))


class ObjectCheckpoints:
    """A TF2 tf.train.Checkpoint of OBJECTS, saved through commit() into SAVE_TO (default
    DIRECTORY) and restored from DIRECTORY's newest complete checkpoint."""

    def __init__(self, tf, directory, save_to=None, log=None, **objects):
        self.checkpoint = tf.train.Checkpoint(**objects)
        self.directory, self.save_to, self.log = directory, save_to or directory, log

    def restore(self):
        """The entry restored from, or None (nothing to resume from)."""
        found = latest(self.directory, self.log)
        if found is None:
            return None
        if self.log is not None:
            self.log("restoring checkpoint %s" % found.folder)
        self.checkpoint.restore(found.entry)
        return found.entry

    def save(self, step):
        return commit(self.save_to, step,
                      lambda folder: self.checkpoint.write(os.path.join(folder, "ckpt")))
