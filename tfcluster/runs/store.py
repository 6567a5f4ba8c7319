"""Run records: runs/<run-id>/run.json plus every task's log, on the controller."""
import contextlib
import json
import os
import re
import sys
import time

from tfcluster.errors import UsageError
from tfcluster.runs.record import RecordError, RunRecord
from tfcluster_agent import cachedir

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def now():
    """The time in UTC, ISO 8601 to the second (time, not datetime: cheaper for every launch)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


@contextlib.contextmanager
def private_files():
    """Files made inside are their owner's alone (run folders and records: logs may hold what
    tasks print); the umask is given back afterwards, for whoever called in-process."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def new_run_id(example):
    """time-example-host-random: ids from two controllers (or two launches) do not collide."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # uname and urandom: socket and secrets (hmac, random, OpenSSL) would cost every launch.
    host = re.sub(r"[^A-Za-z0-9]", "", os.uname().nodename.split(".")[0])[:12] or "host"
    return "%s-%s-%s-%s" % (stamp, example, host, os.urandom(3).hex())


def check_run_id(run_id):
    if not run_id:  # an unset variable in a script: never "the newest run"
        raise UsageError("the run id is empty: give one, or leave the argument out")
    if not RUN_ID.fullmatch(run_id):
        shown = run_id if len(run_id) <= 60 else "%s... (%d characters)" % (run_id[:40], len(run_id))
        raise UsageError("run id %r may only use letters, digits, '.', '_' and '-' (100 at most, "
                         "starting with a letter or digit): pick another" % shown)
    return run_id


def writable_dir(path, what, fix="pass a folder you can write to"):
    """Create PATH if needed and check a file can be written there; WHAT names the option, FIX
    what to do instead."""
    try:
        if os.path.exists(path) and not os.path.isdir(path):
            raise NotADirectoryError("it is a file")
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".tfcluster-probe-%d" % os.getpid())
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as err:
        reason = err.strerror or str(err)
        raise UsageError("%s %s cannot hold files (%s): %s"
                         % (what, path, reason.lower() if reason else "not writable", fix)) from None
    return path


@contextlib.contextmanager
def folder_for(path, what):
    """writable_dir(PATH, WHAT) for the block: the folders it had to create are removed again
    when the block fails and leaves them empty."""
    created = []
    folder = os.path.abspath(path)
    while not os.path.lexists(folder):
        created.append(folder)  # innermost first
        folder = os.path.dirname(folder)
    try:
        yield writable_dir(path, what)
    except BaseException:
        for folder in created:
            try:
                os.rmdir(folder)
            except OSError:
                break  # not empty (what the block made is kept), or never made
        raise


def keep_caches(runs_dir):
    """Without a home that can hold tfcluster's cache (tfcluster_agent/cachedir.py), a private
    folder under RUNS_DIR is the cache of this command and of the local agents it starts
    (XDG_CACHE_HOME, which they inherit), and without a usable home Ansible and Keras get
    theirs there (ANSIBLE_HOME, KERAS_HOME: each would fail, or as root make the missing home).
    The warning says so, once."""
    folder, warning = cachedir.cache_folder(os.path.abspath(os.path.join(runs_dir, ".cache")))
    if warning:
        print("tfcluster: warning: " + warning, file=sys.stderr, flush=True)
        if folder:
            os.environ["XDG_CACHE_HOME"] = os.path.dirname(folder)
    if cachedir.home() is None:
        cachedir.keep_keras_home(folder)
        if "ANSIBLE_HOME" not in os.environ and "ANSIBLE_LOCAL_TMP" not in os.environ:
            if folder:
                os.environ["ANSIBLE_HOME"] = os.path.join(folder, "ansible")
            else:  # Ansible makes (and removes) a private folder of its own in it
                import tempfile  # here: only where no home can hold the cache
                os.environ["ANSIBLE_LOCAL_TMP"] = tempfile.gettempdir()


def save(record):
    """Write RECORD's run.json: the one place a run record is written."""
    if not record.claimed:
        os.makedirs(record.runs_dir, exist_ok=True)
        try:
            os.mkdir(record.dir)  # atomic: two launches with one id cannot both get here
        except FileExistsError:
            raise UsageError("run %s already exists in %s: pick another --run-id"
                             % (record.id, record.runs_dir)) from None
        record.claimed = True
    tmp = record.path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(record.to_json(), handle, indent=2, sort_keys=True)
    os.replace(tmp, record.path)


def create(runs_dir, run_id):
    """A new record; its folder is created (exclusively) by its first save()."""
    record = RunRecord(id=run_id, runs_dir=runs_dir)
    if os.path.exists(record.dir):
        raise UsageError("run %s already exists in %s: pick another --run-id" % (run_id, runs_dir))
    return record


def load(runs_dir, run_id):
    path = os.path.join(runs_dir, check_run_id(run_id), "run.json")
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise UsageError("no run %s in %s: `tfcluster runs` lists them" % (run_id, runs_dir)) from None
    except (OSError, ValueError) as err:
        raise UsageError("run %s: cannot read %s (%s): repair or remove that folder"
                         % (run_id, path, str(err).splitlines()[0])) from None
    try:
        record = RunRecord.from_json(data, runs_dir)
    except RecordError as err:
        raise UsageError("run %s: %s is not a tfcluster run record (%s): repair or remove that "
                         "folder" % (run_id, path, err)) from None
    record.id = run_id  # the folder's name, as before (a copied folder is that run)
    return record


def all_runs(runs_dir):
    """Every readable run, oldest first; a folder that is not one is skipped with a warning."""
    records = []
    if not os.path.isdir(runs_dir):
        return records
    for name in sorted(os.listdir(runs_dir)):
        if not os.path.exists(os.path.join(runs_dir, name, "run.json")):
            continue
        try:
            if not RUN_ID.fullmatch(name):
                raise UsageError("%r is not a run id: rename or remove that folder" % name)
            records.append(load(runs_dir, name))
        except UsageError as err:
            print("tfcluster: warning: skipping %s: %s" % (os.path.join(runs_dir, name), err),
                  file=sys.stderr, flush=True)
    return sorted(records, key=lambda r: str(r.created or ""))


def latest(runs_dir, active_only=False):
    """The newest run (the newest still running one with ACTIVE_ONLY)."""
    candidates = [r for r in all_runs(runs_dir) if r.active or not active_only]
    if not candidates:
        what = "running run" if active_only else "run"
        raise UsageError("no %s in %s: name one, or start one with `tfcluster launch`"
                         % (what, runs_dir))
    return candidates[-1]


def host_run_dir(machine, run_id):
    """The machine's folder of the run: <workdir>/<run-id>, or <workdir>/<run-id>/<host> when
    other machines of the run share its workdir (sharing.place_run_folders)."""
    folder = machine.workdir.rstrip("/") + "/" + run_id
    return folder + "/" + machine.run_subdir if machine.run_subdir else folder


def write_private(path, data):
    """PATH, its owner's alone, holding DATA (text or bytes)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:  # no file object: two files a task, 128 tasks
        left = memoryview(data.encode() if isinstance(data, str) else data)
        while left:
            left = left[os.write(fd, left):]
    finally:
        os.close(fd)


def replace_private(path, data):
    """write_private, aside and renamed: a reader finds the whole of DATA or no file."""
    write_private(path + ".tmp", data)
    os.replace(path + ".tmp", path)


def write_task_records(record_dir, cluster, public_specs):
    """Every task's spec as the run's record keeps it (no env values): RECORD_DIR/NAME.task.json."""
    for task in cluster.tasks:
        write_private(os.path.join(record_dir, task.name + ".task.json"),
                      json.dumps(public_specs[task.label], indent=1))
