"""What exactly ran (docs/provenance.md): the controller's checkout (its commit, and its uncommitted
changes in runs/ID/code.diff), the command line and the environment the tasks got with every
--env value hidden, and the package sets the hosts' task interpreters import from (the hosts'
own facts are their preflight's, kept in the record's machines: RECORDED_FACTS)."""
import os

from tfcluster import __version__
from tfcluster_agent.values import field, fields, value_class

HIDDEN = "<hidden>"        # an --env value, which no file or log holds
DIFF_FILE = "code.diff"
UNTRACKED_LIMIT = 1 << 20  # bytes: a larger untracked file is named, not copied into code.diff
GIT_SECONDS = 30


@value_class
class Provenance:
    """run.json's "provenance"."""
    commit: str | None = None          # the controller checkout's HEAD (None: not a git checkout)
    dirty: bool = False                # uncommitted changes, in DIFF_FILE
    left_out: list = field(default_factory=list)   # untracked files not in DIFF_FILE, and why
    version: str | None = None         # tfcluster's
    command_line: list = field(default_factory=list)  # as typed, --env values hidden
    cwd: str | None = None
    env: dict = field(default_factory=dict)        # what every task got alike
    env_per_task: list = field(default_factory=list)  # names whose values differ per task
    packages: dict = field(default_factory=dict)   # packages_hash -> {name: version}
    rerun_of: str | None = None

    def to_json(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data):
        if not isinstance(data, dict):
            raise ValueError("provenance is not an object")
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def hidden_argv(argv):
    """ARGV with the value of every --env NAME=VALUE hidden; the trainer's arguments after a
    bare -- as given."""
    shown, hide_next = [], False
    for at, token in enumerate(argv):
        if token == "--":
            return shown + list(argv[at:])
        if hide_next:
            shown.append(_hide(token))
        elif token.startswith("--env="):
            shown.append("--env=" + _hide(token[len("--env="):]))
        else:
            shown.append(token)
        hide_next = token == "--env"
    return shown


def _hide(item):
    name, sep, _ = item.partition("=")
    return name + sep + HIDDEN if sep else item


def launch_arguments(command_line):
    """A recorded COMMAND_LINE's arguments (after the program) that decide what runs: without
    --runs-dir and --run-id, which only say where its record goes."""
    kept, skip = [], False
    for at, token in enumerate(command_line[1:], 1):
        if token == "--":
            return kept + list(command_line[at:])
        if skip:
            skip = False
        elif token in ("--runs-dir", "--run-id"):
            skip = True
        elif not token.startswith(("--runs-dir=", "--run-id=")):
            kept.append(token)
    return kept


def task_environment(specs, hidden_names):
    """(env, env_per_task): {name: value} every task of SPECS ({label: TaskSpec}) got alike, the
    values of HIDDEN_NAMES (--env, --env-file) hidden, and the names whose values differ per
    task (TF_CONFIG and the like: the cluster and the task records say them)."""
    envs = [spec.env for spec in specs.values()]
    names = sorted(set().union(*envs)) if envs else []
    common, varying = {}, []
    for name in names:
        values = {env.get(name) for env in envs}
        if name in hidden_names:
            common[name] = HIDDEN
        elif len(values) == 1:
            common[name] = values.pop()
        else:
            varying.append(name)
    return common, varying


class Checkout:
    """The git state of the controller's checkout at ROOT, asked in a thread (started at once)
    while the preflight waits for the hosts: commit, dirty, and the diff of what is not
    committed (tracked changes and untracked files) as `git apply` reads it."""

    def __init__(self, root):
        self.root = root
        self.commit, self.dirty, self.diff, self.left_out = None, False, b"", []
        # Only a checkout's own top: an installed tfcluster may sit in someone's repository.
        self._thread = None
        if os.path.exists(os.path.join(root, ".git")):
            import threading  # here, as subprocess below: most commands only read records
            self._thread = threading.Thread(target=self._ask, daemon=True)
            self._thread.start()

    def _git(self, *args):
        return self._subprocess.run(["git", "-C", self.root] + list(args), capture_output=True,
                                    timeout=GIT_SECONDS, stdin=self._subprocess.DEVNULL)

    def _ask(self):
        import subprocess  # here: records are read by commands that start no process
        self._subprocess = subprocess
        try:
            status = self._git("status", "--porcelain=v2", "--branch", "-z",
                               "--untracked-files=all")
            if status.returncode != 0:
                return
            entries = status.stdout.split(b"\0")
            untracked = []
            for entry in entries:
                if entry.startswith(b"# branch.oid ") and entry[13:] != b"(initial)":
                    self.commit = entry[13:].decode()
                elif entry[:2] in (b"1 ", b"2 ", b"u "):
                    self.dirty = True
                elif entry.startswith(b"? "):
                    untracked.append(entry[2:].decode(errors="surrogateescape"))
            self.dirty = self.dirty or bool(untracked)
            if self.dirty:
                tracked = self._git("diff", "HEAD", "--binary") if self.commit else None
                self.diff = (tracked.stdout if tracked and tracked.returncode == 0 else b"") + \
                    b"".join(self._new_file(path) for path in untracked)
        except (OSError, subprocess.SubprocessError) as err:
            self.left_out.append("the checkout's state (git: %s)" % err)

    def _new_file(self, path):
        """PATH, untracked, as a new file's diff (b"" when left out, named in left_out)."""
        full = os.path.join(self.root, path)
        try:
            if os.path.islink(full) or not os.path.isfile(full):
                self.left_out.append("%s (not a plain file)" % path)
                return b""
            if os.path.getsize(full) > UNTRACKED_LIMIT:
                self.left_out.append("%s (over %d KiB)" % (path, UNTRACKED_LIMIT >> 10))
                return b""
            with open(full, "rb") as handle:
                content = handle.read()
            mode = "100755" if os.access(full, os.X_OK) else "100644"
        except OSError as err:
            self.left_out.append("%s (%s)" % (path, err.strerror))
            return b""
        if b"\0" in content[:8192]:
            self.left_out.append("%s (binary)" % path)
            return b""
        name = path.encode(errors="surrogateescape")
        head = b"diff --git a/%s b/%s\nnew file mode %s\n" % (name, name, mode.encode())
        if not content:
            return head
        lines = content.split(b"\n")
        ending = b"" if lines[-1] == b"" else b"\n\\ No newline at end of file"
        if not ending:
            lines.pop()
        return head + b"--- /dev/null\n+++ b/%s\n@@ -0,0 +1,%d @@\n" % (name, len(lines)) + \
            b"\n".join(b"+" + line for line in lines) + ending + b"\n"

    def wait(self):
        if self._thread is not None:
            self._thread.join(GIT_SECONDS * 2 + 5)
        return self


def make(checkout, command_line, specs, hidden_names, reports, rerun_of=None):
    """The run's Provenance, once CHECKOUT (a Checkout) has answered."""
    checkout.wait()
    env, per_task = task_environment(specs, hidden_names)
    return Provenance(commit=checkout.commit, dirty=checkout.dirty,
                      left_out=list(checkout.left_out), version=__version__,
                      command_line=list(command_line), cwd=os.getcwd(), env=env,
                      env_per_task=per_task, packages=package_sets(reports), rerun_of=rerun_of)


def package_sets(reports):
    """{packages_hash: {name: version}} of REPORTS' hosts."""
    return {r.packages_hash: r.packages for r in reports if r.packages_hash}


def differences(old, new):
    """[(name, version in OLD or None, version in NEW or None)] of two package sets, by name."""
    return [(name, old.get(name), new.get(name)) for name in sorted(set(old) | set(new))
            if old.get(name) != new.get(name)]


def describe(changes, reference, most=12):
    """CHANGES (differences(REFERENCE's set, another's)) as the other side says them:
    'extra-pkg 1.0 (localhost: none), numpy 2.0.0 (localhost: 1.26.4)'."""
    words = ["%s %s (%s: %s)" % (name, new or "none", reference, old or "none")
             for name, old, new in changes[:most]]
    if len(changes) > most:
        words.append("and %d more" % (len(changes) - most))
    return ", ".join(words)


def package_warnings(machines, reports):
    """One line per machine whose package set differs from most machines' (the first one's set
    on a tie), the differing packages named; REPORTS: {machine key: its PreflightReport}."""
    groups = {}
    for machine in machines:
        report = reports[machine.key]
        if report.packages_hash:
            groups.setdefault(report.packages_hash, []).append((machine.label, report))
    if len(groups) < 2:
        return []
    common = max(groups.values(), key=len)
    reference, base = common[0][0], common[0][1].packages
    return ["%s: its packages differ from %s's: %s" % (
        label, reference, describe(differences(base, report.packages), reference))
        for members in groups.values() if members is not common for label, report in members]
