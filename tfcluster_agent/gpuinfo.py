"""What a host's GPUs are doing, from nvidia-smi's documented query interface and /proc.

Standard library only; the agent runs it at preflight and for `tfcluster gpus`.
"""
import os
import pwd
import subprocess

from tfcluster_agent import gpuclaims

# Documented --query-gpu fields (nvidia-smi --help-query-gpu), in the order we ask for them.
GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu",
              "ecc.errors.uncorrected.volatile.total", "retired_pages.pending", "driver_version")
APP_FIELDS = ("gpu_uuid", "pid", "used_memory")
# Row-remapping failure is no --query-gpu field: nvidia-smi answers it with a query of its own,
# --query-remapped-rows (Ampere and later; older boards answer an error, read as "unknown").
REMAP_FIELDS = ("gpu_uuid", "remapped_rows.failure")
CSV = "--format=csv,noheader,nounits"
TIMEOUT = 20
COMMAND_CHARS = 60


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
    """True for "Yes" or a count above 0; None when unknown."""
    text = value(text)
    if text is None:
        return None
    if text.lower() in ("yes", "true"):
        return True
    if text.lower() in ("no", "false"):
        return False
    count = number(text)
    return None if count is None else count > 0


def rows(nvidia_smi, query, fields):
    """The CSV rows of one query (each a list of len(fields) strings); None when it failed."""
    try:
        out = subprocess.run([nvidia_smi, "%s=%s" % (query, ",".join(fields)), CSV],
                             capture_output=True, text=True, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    found = []
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > len(fields):  # a name with commas: they belong to the name field
            extra = len(cells) - len(fields)
            at = fields.index("name") if "name" in fields else 0
            cells[at:at + extra + 1] = [", ".join(cells[at:at + extra + 1])]
        if len(cells) == len(fields):
            found.append(cells)
    return found


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


def host_gpus(nvidia_smi="nvidia-smi", own_claims=()):
    """{"driver", "gpus": [...], "error"} for this host; "gpus" is [] without a driver.

    Each GPU: index, uuid, name, memory_used/memory_total (MiB), utilization (%), ecc_errors
    (uncorrected, volatile), retired_pending, remap_failed, processes [{pid, used_memory, user,
    command}], claim (the tfcluster run holding it, unless in OWN_CLAIMS: this agent's)."""
    gpu_rows = rows(nvidia_smi or "nvidia-smi", "--query-gpu", GPU_FIELDS)
    if gpu_rows is None:
        return {"driver": None, "gpus": [], "error": "nvidia-smi did not answer"}
    app_rows = rows(nvidia_smi or "nvidia-smi", "--query-compute-apps", APP_FIELDS) or []
    remap_rows = rows(nvidia_smi or "nvidia-smi", "--query-remapped-rows", REMAP_FIELDS) or []
    remapped = {uuid: yes(failure) for uuid, failure in remap_rows}
    gpus, drivers = [], set()
    for cells in gpu_rows:
        row = dict(zip(GPU_FIELDS, cells))
        if number(row["index"]) is None:
            continue
        drivers.add(value(row["driver_version"]))
        uuid = value(row["uuid"]) or "index-%s" % row["index"]
        gpus.append({
            "index": number(row["index"]), "uuid": uuid, "name": value(row["name"]) or "?",
            "memory_used": number(row["memory.used"]), "memory_total": number(row["memory.total"]),
            "utilization": number(row["utilization.gpu"]),
            "ecc_errors": number(row["ecc.errors.uncorrected.volatile.total"]),
            "retired_pending": yes(row["retired_pages.pending"]),
            "remap_failed": remapped.get(uuid),
            "processes": [],
            "claim": None if uuid in own_claims else gpuclaims.holder(uuid)})
    by_uuid = {g["uuid"]: g for g in gpus}
    for gpu_uuid, pid, used in app_rows:
        gpu, pid = by_uuid.get(value(gpu_uuid)), number(pid)
        if gpu is None or pid is None:
            continue
        user, command = process_owner(pid)
        gpu["processes"].append({"pid": pid, "used_memory": number(used), "user": user,
                                 "command": command})
    drivers.discard(None)
    return {"driver": ",".join(sorted(drivers)) or None,
            "gpus": sorted(gpus, key=lambda g: g["index"]), "error": None}


def smi_lines(facts):
    """The GPUs as `nvidia-smi -L` lines ("GPU 0: NAME (UUID: ...)"), for the older report key."""
    return ["GPU %d: %s (UUID: %s)" % (g["index"], g["name"], g["uuid"]) for g in facts["gpus"]]
