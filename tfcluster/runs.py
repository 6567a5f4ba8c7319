"""Run records: runs/<run-id>/run.json plus every task's log, on the controller."""
import datetime
import json
import os
import re
import secrets

from tfcluster.errors import UsageError

RESULT_PREFIX = "TFCLUSTER_RESULT "
ACTIVE_STATES = ("starting", "running")
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def new_run_id(example):
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return "%s-%s-%s" % (stamp, example, secrets.token_hex(2))


def check_run_id(run_id):
    if not RUN_ID.match(run_id):
        raise UsageError("run id %r may only use letters, digits, '.', '_' and '-'" % run_id)
    return run_id


class RunRecord:
    def __init__(self, runs_dir, run_id, data=None):
        self.runs_dir = runs_dir
        self.id = run_id
        self.data = data if data is not None else {"id": run_id}

    @property
    def dir(self):
        return os.path.join(self.runs_dir, self.id)

    @property
    def path(self):
        return os.path.join(self.dir, "run.json")

    def save(self):
        os.makedirs(self.dir, exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(self.data, handle, indent=2, sort_keys=True)
        os.replace(tmp, self.path)

    def __getitem__(self, key):
        return self.data[key]

    def get(self, key, default=None):
        return self.data.get(key, default)

    @property
    def active(self):
        return self.data.get("state") in ACTIVE_STATES


def create(runs_dir, run_id):
    record = RunRecord(runs_dir, run_id)
    if os.path.exists(record.dir):
        raise UsageError("run %s already exists in %s: pick another --run-id" % (run_id, runs_dir))
    return record


def load(runs_dir, run_id):
    record = RunRecord(runs_dir, check_run_id(run_id))
    try:
        with open(record.path) as handle:
            record.data = json.load(handle)
    except FileNotFoundError:
        raise UsageError("no run %s in %s: `tfcluster runs` lists them" % (run_id, runs_dir)) from None
    return record


def all_runs(runs_dir):
    records = []
    if not os.path.isdir(runs_dir):
        return records
    for name in sorted(os.listdir(runs_dir)):
        if os.path.exists(os.path.join(runs_dir, name, "run.json")):
            records.append(load(runs_dir, name))
    return sorted(records, key=lambda r: r.get("created", ""))


def latest(runs_dir, active_only=False):
    """The newest run (the newest still running one with ACTIVE_ONLY)."""
    candidates = [r for r in all_runs(runs_dir) if r.active or not active_only]
    if not candidates:
        what = "running run" if active_only else "run"
        raise UsageError("no %s in %s: name one, or start one with `tfcluster launch`"
                         % (what, runs_dir))
    return candidates[-1]


def results_from_log(text):
    """The last TFCLUSTER_RESULT line of a log, parsed; None when there is none."""
    found = None
    for line in text.splitlines():
        if line.startswith(RESULT_PREFIX):
            try:
                found = json.loads(line[len(RESULT_PREFIX):])
            except ValueError:
                continue
    return found
