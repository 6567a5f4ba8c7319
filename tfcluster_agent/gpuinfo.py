"""What a host's GPUs are doing, from nvidia-smi and /proc.

`nvidia-smi -L` says which GPUs there are; the documented query interface (--query-gpu,
--query-compute-apps, --query-remapped-rows) says what they are doing. Degrade loudly, never
silently: when a query fails, hangs or answers rows of an unexpected shape, the GPUs -L lists are
still reported (their unknown facts None, "checked" False) and "warning" carries nvidia-smi's own
words; a field the driver does not know is dropped and the query asked again. nvidia-smi present
but listing no GPU, a lost GPU, or a hung -L are the host's "error". Standard library only; the
agent runs it at preflight and for `tfcluster gpus`.
"""
import os
import pwd
import re
import subprocess
import time
from typing import NamedTuple

from tfcluster_agent import gpuclaims

# Documented --query-gpu fields (nvidia-smi --help-query-gpu), in the order we ask for them.
GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu",
              "ecc.errors.uncorrected.volatile.total", "retired_pages.pending", "mig.mode.current",
              "driver_version")
REQUIRED = ("index", "uuid", "gpu_uuid", "pid")  # a row without them matches nothing
APP_FIELDS = ("gpu_uuid", "pid", "used_memory")
# Row-remapping failure is no --query-gpu field: nvidia-smi answers it with a query of its own,
# --query-remapped-rows (Ampere and later; older boards answer an error, read as "unknown").
REMAP_FIELDS = ("gpu_uuid", "remapped_rows.failure")
CSV = "--format=csv,noheader,nounits"
# The facts that come from nvidia-smi alone (not /proc, not claims): what a replay of saved
# answers compares (scripts/gpu-smoke saves them, tests/test_nvidia_smi.py replays them).
SMI_FACTS = ("index", "uuid", "name", "memory_total", "ecc_errors", "retired_pending",
             "remap_failed", "mig", "mig_devices", "checked")
DEADLINE = 20  # seconds for all of a host's nvidia-smi calls together (a stuck driver hangs them)
COMMAND_CHARS = 60
TEXT_CHARS = 200
UNKNOWN_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
LIST_LINE = re.compile(r"^GPU (\d+): (.*) \(UUID: ([^)]+)\)\s*$")
MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)")
# nvidia-smi's words for a GPU the driver lost (NVML_ERROR_GPU_IS_LOST and kin): the host needs
# attention before any GPU of it is used.
LOST = ("Unable to determine the device handle", "GPU is lost")


class Answer(NamedTuple):
    code: int | None  # None: it did not answer in time
    out: str
    err: str


def run_smi(argv, timeout):
    """The Answer of one nvidia-smi call. One that does not end within TIMEOUT seconds is killed
    and not waited for longer than a second: a process stuck in the driver (D state) ignores
    SIGKILL until the driver lets go, and must not hang the agent with it."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=1)
        except subprocess.TimeoutExpired:
            proc.stdout.close()
            proc.stderr.close()
        return Answer(None, "", "")
    return Answer(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


class Smi:
    """One host's nvidia-smi calls, all within one deadline; after a call that timed out the
    rest are not made (they would hang the same way)."""

    def __init__(self, program, deadline=DEADLINE):
        self.program, self.deadline = program, deadline
        self.ends = time.monotonic() + deadline
        self.hung = None  # the first call that timed out

    def ask(self, *args):
        left = self.ends - time.monotonic()
        if self.hung or left <= 0:
            return Answer(None, "", "")
        answer = run_smi([self.program] + list(args), left)
        if answer.code is None:
            self.hung = "nvidia-smi " + args[0].split("=")[0]
        return answer

    def hung_text(self):
        return "%s did not answer within %gs (a stuck driver? `dmesg` shows its Xid errors)" % (
            self.hung, self.deadline)


def words(answer, answered=lambda line: False):
    """What a call printed, on one line (nvidia-smi prints its errors on stdout), without the
    lines that ANSWERED the call when it printed others too."""
    lines = [line.strip() for line in (answer.out + "\n" + answer.err).splitlines()
             if line.strip()]
    text = " ".join([line for line in lines if not answered(line)] or lines)
    return text[:TEXT_CHARS - 3] + "..." if len(text) > TEXT_CHARS else text


def said(answer, what, answered=lambda line: False):
    """A failed call in nvidia-smi's own words: "WHAT failed (exit N): its text"."""
    text = words(answer, answered)
    return "%s failed (exit %s)%s" % (what, answer.code, ": " + text if text else "")


def lost_line(answer):
    for line in (answer.out + "\n" + answer.err).splitlines():
        if any(word in line for word in LOST):
            return line.strip()
    return None


def value(text):
    """A field as nvidia-smi prints it: None for "[N/A]", "[Not Supported]" and the like."""
    text = text.strip()
    if not text or (text.startswith("[") and text.endswith("]")) or text in ("N/A", "Unknown"):
        return None
    return text


def number(text):
    text = value(text)
    try:
        return int(text) if text is not None else None
    except ValueError:
        try:
            return int(float(text))
        except ValueError:
            return None


def yes(text):
    """True for "Yes", "Enabled" or a count above 0; None when unknown."""
    text = value(text)
    if text is None:
        return None
    if text.lower() in ("yes", "true", "enabled"):
        return True
    if text.lower() in ("no", "false", "disabled"):
        return False
    count = number(text)
    return None if count is None else count > 0


def csv_rows(text, fields):
    """(rows as {field: text}, the first line of an unexpected shape or None)."""
    found = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > len(fields) and "name" in fields:  # a name with commas: they are its own
            at, extra = fields.index("name"), len(cells) - len(fields)
            cells[at:at + extra + 1] = [", ".join(cells[at:at + extra + 1])]
        if len(cells) != len(fields):
            return found, line.strip()
        found.append(dict(zip(fields, cells)))
    return found, None


def query(smi, kind, fields):
    """(rows, dropped fields, why it failed or None) of one --query-* call. A field the driver
    does not know (`Field "X" is not a valid field to query.`, exit 2) is dropped and the query
    asked again, so a board lacking one counter is still checked for the others."""
    fields, dropped = list(fields), []
    while True:
        answer = smi.ask("%s=%s" % (kind, ",".join(fields)), CSV)
        if answer.code is None:
            return None, dropped, smi.hung_text()
        unknown = UNKNOWN_FIELD.search(answer.out + answer.err)
        if answer.code != 0 and unknown and unknown.group(1) in fields and \
                unknown.group(1) not in REQUIRED:
            fields.remove(unknown.group(1))
            dropped.append(unknown.group(1))
            continue
        if answer.code != 0:
            return None, dropped, said(answer, "nvidia-smi " + kind,
                                       lambda line: len(line.split(",")) >= len(fields))
        rows, odd = csv_rows(answer.out, fields)
        if odd is not None:
            return None, dropped, "nvidia-smi %s answered a row of an unexpected shape: %r" % (
                kind, odd[:TEXT_CHARS])
        return rows, dropped, None


def listed_line(line):
    return bool(LIST_LINE.match(line.strip()) or MIG_LINE.match("  " + line.strip()))


def listed_gpus(answer):
    """The GPUs of `nvidia-smi -L` lines, each with the MIG devices listed under it."""
    gpus = []
    for line in answer.out.splitlines():
        match, mig = LIST_LINE.match(line.strip()), MIG_LINE.match(line)
        if match:
            gpus.append({"index": int(match.group(1)), "name": match.group(2).strip(),
                         "uuid": match.group(3).strip(), "mig_devices": []})
        elif mig and gpus:
            gpus[-1]["mig_devices"].append(mig.group(1))
    return gpus


def process_owner(pid):
    """(user, command) of PID from /proc; (None, None) where it is not visible (a container)."""
    try:
        uid = os.stat("/proc/%d" % pid).st_uid
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return None, None
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    words = [w.decode(errors="replace") for w in argv if w]
    if words:
        words[0] = os.path.basename(words[0])
    command = " ".join(words)
    if len(command) > COMMAND_CHARS:
        command = command[:COMMAND_CHARS - 3] + "..."
    return user, command or None


def gpu_facts(listed, row, remapped, own_claims):
    """One GPU's facts: what -L listed, filled in from its --query-gpu ROW (None: unknown)."""
    row = row or {}
    mig = yes(row.get("mig.mode.current", ""))
    return {
        "index": listed["index"], "uuid": listed["uuid"],
        "name": value(row.get("name", "")) or listed["name"] or "?",
        "memory_used": number(row.get("memory.used", "")),
        "memory_total": number(row.get("memory.total", "")),
        "utilization": number(row.get("utilization.gpu", "")),
        "ecc_errors": number(row.get("ecc.errors.uncorrected.volatile.total", "")),
        "retired_pending": yes(row.get("retired_pages.pending", "")),
        "remap_failed": remapped.get(listed["uuid"]),
        "mig": True if listed["mig_devices"] else mig,
        "mig_devices": listed["mig_devices"],
        "checked": bool(row),
        "processes": [],
        "claim": None if listed["uuid"] in own_claims else gpuclaims.holder(listed["uuid"])}


def host_gpus(nvidia_smi="nvidia-smi", own_claims=(), deadline=DEADLINE):
    """{"driver", "gpus", "error", "warning", "absent"} for this host.

    "absent": why there is no nvidia-smi (a host without GPUs); "error": nvidia-smi is there but
    lists no usable GPU (none found, a lost GPU, a hung driver); "warning": the GPUs are listed
    but some of their facts are unknown (one line, nvidia-smi's own words). Each GPU: index,
    uuid, name, memory_used/memory_total (MiB), utilization (%), ecc_errors (uncorrected,
    volatile), retired_pending, remap_failed, mig (MIG mode on), mig_devices, checked (its
    query row was read), processes [{pid, used_memory, user, command}], claim (the tfcluster run
    holding it, unless in OWN_CLAIMS: this agent's)."""
    smi = Smi(nvidia_smi or "nvidia-smi", deadline)
    try:
        listing = smi.ask("-L")
    except OSError as err:  # no nvidia-smi (or not executable): a host without GPUs
        return {"driver": None, "gpus": [], "error": None, "warning": None,
                "absent": "%s: %s" % (nvidia_smi or "nvidia-smi", err.strerror)}
    found = {"driver": None, "gpus": [], "error": None, "warning": None, "absent": None}
    listed = listed_gpus(listing)
    if listing.code is None:
        found["error"] = smi.hung_text()
    elif lost_line(listing):
        found["error"] = "nvidia-smi -L: " + lost_line(listing)
    elif not listed:
        found["error"] = said(listing, "nvidia-smi -L") if listing.code else \
            "nvidia-smi -L lists no GPU" + (": " + words(listing) if words(listing) else "")
    if found["error"]:
        return found
    # A failure beside the listed GPUs (exit 14, "WARNING: infoROM is corrupted at gpu ..."): said.
    warnings = [said(listing, "nvidia-smi -L", listed_line)] if listing.code else []
    gpu_rows, dropped, why = query(smi, "--query-gpu", GPU_FIELDS)
    if why and any(word in why for word in LOST):
        found["error"] = why
        return found
    if why:
        warnings.append("GPU occupancy and health unknown, its %d GPU(s) from nvidia-smi -L are "
                        "handed out unchecked: %s" % (len(listed), why))
    rows = {}
    for row in gpu_rows or ():
        rows[value(row["uuid"])] = row
        found["driver"] = found["driver"] or value(row.get("driver_version", ""))
    missing = [g["index"] for g in listed if g["uuid"] not in rows]
    if gpu_rows is not None and missing:
        warnings.append("nvidia-smi --query-gpu has no row for GPU %s of nvidia-smi -L: its "
                        "occupancy and health are unknown" % ", ".join(map(str, missing)))
    remap_rows, _, _ = query(smi, "--query-remapped-rows", REMAP_FIELDS) if gpu_rows else \
        (None, None, None)
    # Silent when it fails: boards before Ampere have no row remapping to ask about.
    remapped = {value(r["gpu_uuid"]): yes(r.get("remapped_rows.failure", ""))
                for r in remap_rows or ()}
    gpus = [gpu_facts(g, rows.get(g["uuid"]), remapped, own_claims) for g in listed]
    by_uuid = {g["uuid"]: g for g in gpus}
    app_rows, app_dropped, app_why = query(smi, "--query-compute-apps", APP_FIELDS)
    if app_why and not why:
        warnings.append("the processes on its GPUs are unknown: " + app_why)
    for row in app_rows or ():
        gpu, pid = by_uuid.get(value(row["gpu_uuid"])), number(row["pid"])
        if gpu is None or pid is None:
            continue
        user, command = process_owner(pid)
        gpu["processes"].append({"pid": pid, "used_memory": number(row.get("used_memory", "")),
                                 "user": user, "command": command})
    dropped += app_dropped
    if dropped:
        warnings.append("nvidia-smi answers %s (an older driver or board): its GPUs are "
                        "checked without %s" % (" ".join('`Field "%s" is not a valid field to '
                                                         'query.`' % f for f in dropped),
                                                ", ".join(dropped)))
    found["gpus"] = sorted(gpus, key=lambda g: g["index"])
    found["warning"] = "; ".join(warnings) or None
    return found


def smi_lines(facts):
    """The GPUs as `nvidia-smi -L` lines ("GPU 0: NAME (UUID: ...)"), for the older report key."""
    return ["GPU %d: %s (UUID: %s)" % (g["index"], g["name"], g["uuid"]) for g in facts["gpus"]]
