"""Which GPUs each task sees, decided per machine from the GPU facts preflight reported.

Training tasks (chief, worker) get their own GPUs by default: the machine's free, healthy GPUs
that no slot lists in tfcluster_gpus, split among its tasks that list none. ps and evaluator
tasks see no GPU unless their slot lists some. More tasks than GPUs: tasks share, with memory
growth on. A GPU that is unhealthy, in MIG mode, busy (another process computes on it or holds
memory) or claimed by another tfcluster run is never handed out; a GPU whose facts nvidia-smi
could not give is handed out with a warning (docs/gpus.md).
"""
import re

from tfcluster.errors import Problem
from tfcluster.spec.cluster import TRAINING_JOBS, Cluster
from tfcluster_agent.values import replace

GPU_LINE = re.compile(r"^GPU (\d+):")


def parse_gpu_list(lines):
    """GPU indices from the lines of `nvidia-smi -L` ("GPU 0: NVIDIA A100 (UUID: ...)")."""
    found = []
    for line in lines or ():
        match = GPU_LINE.match(line.strip())
        if match and int(match.group(1)) not in found:
            found.append(int(match.group(1)))
    return sorted(found)


def devices(task):
    """The GPU ids TASK sees, as ints ([] before assign() for a task without listed GPUs)."""
    return [int(d) for d in (task.cuda_visible_devices or "").split(",") if d.strip()]


def reported(reports, machine):
    report = reports.get(machine.key)
    return parse_gpu_list(report.gpus if report else None)


class GpuProblem(Problem):
    """A problem with a host's GPUs: the preflight error lists these one per line."""


def facts(reports, machine):
    """{index: the GPU's facts} of MACHINE from its preflight report."""
    report = reports.get(machine.key)
    found = (report.gpu_facts.get("gpus") if report else None) or []
    return {gpu["index"]: gpu for gpu in found}


# Each health counter: its key in the facts, a few words (the `tfcluster gpus` column) and the
# preflight's reason (naming nvidia-smi's field); %d is the counter's value.
HEALTH = (("ecc_errors", "ECC errors: %d",
           "%d uncorrectable ECC error(s) (ecc.errors.uncorrected.volatile.total)"),
          ("retired_pending", "retired pages pending",
           "retired pages pending a reset (retired_pages.pending)"),
          ("remap_failed", "row remapping failed", "row remapping failed (remapped_rows.failure)"))


def _failing(gpu, column):
    return [texts[column] % gpu[key] if "%" in texts[column] else texts[column]
            for key, *texts in HEALTH if gpu.get(key)]


def health_short(gpu):
    """The `tfcluster gpus` HEALTH column: failing counters, MIG mode, unknown or "ok"."""
    failing = _failing(gpu, 0)
    if failing:
        return "FAILING: " + ", ".join(failing)
    if gpu.get("mig"):
        return mig_mode(gpu)
    return "ok" if gpu.get("checked", True) else "unknown"


def health_problem(gpu):
    """Why GPU must not be used (its first failing health counter), or None."""
    failing = _failing(gpu, 1)
    return failing[0] if failing else None


def mig_mode(gpu):
    devices = len(gpu.get("mig_devices") or ())
    return "MIG mode (%s)" % ("%d MIG device(s)" % devices if devices else "mig.mode.current: "
                              "Enabled")


def describe_process(proc):
    who = "pid %d" % proc["pid"]
    if proc.get("user"):
        who += " (user %s: %s)" % (proc["user"], proc.get("command") or "?")
    if proc.get("used_memory") is not None:
        who += ", %d MiB" % proc["used_memory"]
    return who


def describe_claim(claim):
    text = "run %s" % claim.get("run", "?")
    details = [d for d in ("user %s" % claim["user"] if claim.get("user") else "",
                           "task %s" % claim["task"] if claim.get("task") else "") if d]
    return text + (" (%s)" % ", ".join(details) if details else "")


def holder(gpu, machine):
    """Who holds GPU: the run that claims it, the processes on it, or memory nobody shows; None
    when free. The one wording of `tfcluster gpus` (its HOLDER) and of the preflight."""
    if gpu.get("claim"):
        return describe_claim(gpu["claim"])
    if gpu.get("processes"):
        return "; ".join(describe_process(p) for p in gpu["processes"])
    used = gpu.get("memory_used")
    if used is not None and used > machine.gpu_busy_mib:
        return "a process nvidia-smi does not show, %d MiB (over tfcluster_gpu_busy_mib, %d)" % (
            used, machine.gpu_busy_mib)
    return None


def blocker(gpu, machine, share=False):
    """(reason, waitable) saying why GPU cannot be handed out, or None. Unhealthy and MIG GPUs
    never free themselves; claims and busy processes end."""
    reason = health_problem(gpu)
    if reason:
        return "unhealthy: " + reason, False
    if gpu.get("mig"):
        return "in " + mig_mode(gpu) + ", whose devices tfcluster does not hand out as whole " \
            "GPUs", False
    who = holder(gpu, machine)
    if gpu.get("claim"):
        return "claimed by " + who, True
    if who and not (share or machine.gpu_share):
        return "busy, used by " + who, True
    return None


def usable(reports, machine, share=False):
    """The GPU indices of MACHINE that may be handed out, in order."""
    found = facts(reports, machine)
    return [i for i in reported(reports, machine)
            if i not in found or blocker(found[i], machine, share) is None]


def assign(cluster, reports, share=False):
    """A copy of CLUSTER where every task's cuda_visible_devices is set.

    REPORTS is {machine.key: preflight report}; a report's "gpus" holds nvidia-smi -L lines
    and its "gpu_facts" what each GPU is doing (busy, unhealthy and claimed GPUs are skipped)."""
    chosen = {}
    for machine, tasks in cluster.machines():
        gpus = usable(reports, machine, share)
        listed = {gpu for task in tasks if task.gpus_listed for gpu in devices(task)}
        free = [gpu for gpu in gpus if gpu not in listed] or gpus
        pending = [t for t in tasks if t.cuda_visible_devices is None and t.job in TRAINING_JOBS]
        for i, task in enumerate(pending):
            if len(free) >= len(pending):
                share = free[i * len(free) // len(pending):(i + 1) * len(free) // len(pending)]
            else:
                share = [free[i % len(free)]] if free else []
            chosen[task.label] = ",".join(map(str, share))
    return Cluster([replace(t, cuda_visible_devices=chosen.get(
        t.label, t.cuda_visible_devices if t.cuda_visible_devices is not None else ""))
        for t in cluster.tasks])


def claim_plan(cluster, reports):
    """{machine key: {GPU uuid: [task names]}}: the GPUs each machine's tasks were assigned."""
    plan = {}
    for machine, tasks in cluster.machines():
        known = facts(reports, machine)
        for task in tasks:
            for gpu in devices(task):
                if gpu in known:
                    plan.setdefault(machine.key, {}).setdefault(known[gpu]["uuid"], []).append(
                        task.name)
    return plan


def shares_gpu(task, cluster):
    """True when another task on TASK's machine sees one of TASK's GPUs."""
    mine = set(devices(task))
    return bool(mine) and any(
        other.label != task.label and other.machine.key == task.machine.key and mine & set(devices(other))
        for other in cluster.tasks)


WAIT_HINT = "wait for it (`tfcluster launch --wait`)"
SHARE_HINT = "share it knowingly (--share-busy-gpus or tfcluster_gpu_share: true)"
MIG_HINT = "disable MIG mode (`nvidia-smi -i %d -mig 0` as root, then reset the GPU)"


def host_error(found):
    """Why a host's nvidia-smi is there but gives no usable GPU, or None. An agent older than
    "absent" said "error" for a host without nvidia-smi too (a code not yet synced): not one."""
    return found.get("error") if "absent" in found else None


def wants_gpus(tasks):
    return any(t.gpus_listed or t.job in TRAINING_JOBS for t in tasks)


def host_problems(machine, tasks, reports):
    """MACHINE's nvidia-smi failed, or shows fewer GPUs than tfcluster_gpu_count says: error
    lines (a GPU host whose tasks would otherwise run on CPU without a word)."""
    report = reports.get(machine.key)
    if report is None or not report.reached:
        return []
    error = host_error(report.gpu_facts)
    if error and machine.gpu_count != 0 and wants_gpus(tasks):
        return [GpuProblem("%s: %s: its GPUs cannot be used and its tasks would run on CPU: "
                           "check the GPUs and the driver on the host (a lost GPU needs a "
                           "reboot), or set tfcluster_gpu_count: 0 to run them on CPU knowingly"
                           % (machine.label, error))]
    if machine.gpu_count is None:
        return []
    shown = reported(reports, machine)
    if len(shown) >= machine.gpu_count:
        return []
    why = error or report.gpu_facts.get("absent") or ""
    return [GpuProblem("%s: nvidia-smi shows %d GPU(s)%s but tfcluster_gpu_count says %d: check "
                       "the host (nvidia-smi -L; a board may have fallen off the bus) or fix "
                       "tfcluster_gpu_count" % (machine.label, len(shown),
                                                " (%s)" % why if why else "", machine.gpu_count))]


def preflight_cell(report):
    """The preflight table's GPUS: how many -L lists, "?" after it when their facts are partly
    unknown (a warning says why), "error" when nvidia-smi failed (an error line says how)."""
    found = report.gpu_facts or {}
    if host_error(found):
        return "error"
    return "%d%s" % (len(report.gpus), "?" if found.get("warning") else "")


def warnings(cluster, reports):
    """One line per host whose GPU facts are partly unknown (nvidia-smi's words), and one when
    driver versions differ across the cluster's GPU hosts."""
    lines, drivers = [], {}
    for machine, _ in cluster.machines():
        report = reports.get(machine.key)
        found = report.gpu_facts if report else {}
        if found.get("warning"):
            lines.append("%s: %s" % (machine.label, found["warning"]))
        if found.get("driver"):
            drivers[machine.label] = found["driver"]
    if len(set(drivers.values())) > 1:
        lines.append("NVIDIA driver versions differ (%s): deploy the same driver everywhere "
                     "(nvidia_driver_branch) or expect different results and speeds" % ", ".join(
                         "%s=%s" % item for item in drivers.items()))
    return lines


def listed_fix(gpu, why):
    """The fix for a GPU tfcluster_gpus names that cannot be handed out (WHY: its blocker)."""
    if why[0].startswith("unhealthy"):
        return "replace the board or list another GPU in tfcluster_gpus"
    if not why[1]:
        return "%s or list another GPU in tfcluster_gpus" % (MIG_HINT % gpu)
    return "%s, list another GPU%s" % (WAIT_HINT, "" if why[0].startswith("claimed")
                                       else ", or " + SHARE_HINT)


def no_free_gpu(machine, automatic, gpus, known, share):
    """The problem of a machine none of whose GPUs can be handed out to AUTOMATIC tasks, every
    GPU with its reason. It can be waited out when one GPU would be free once claims and busy
    processes end: unhealthy and MIG GPUs are left out of that count, never waited for."""
    whys = [(i, blocker(known[i], machine, share)) for i in gpus if i in known]
    whys = [(i, why) for i, why in whys if why]
    waitable = [why for _, why in whys if why[1]]
    if waitable:
        busy = any(why[0].startswith("busy") for why in waitable)
        hint = "wait for one (`tfcluster launch --wait`)" + (
            ", or share a busy one knowingly (--share-busy-gpus or tfcluster_gpu_share: true)"
            if busy else "")
    else:
        fixes = ["replace or repair the failing board(s)"] if any(
            why[0].startswith("unhealthy") for _, why in whys) else []
        fixes += [MIG_HINT % i for i, why in whys if why[0].startswith("in MIG")][:1]
        hint = "none frees itself: %s, or run elsewhere" % ", ".join(fixes)
    return GpuProblem("%s: no free GPU for %s: %s: %s" % (
        machine.label, ", ".join(t.label for t in automatic),
        "; ".join("GPU %d %s" % (i, why[0]) for i, why in whys), hint), bool(waitable))


def problems(cluster, reports, share=False):
    """One line per GPU problem, naming the host and the fix; [] when every GPU is fine.

    Lines are GpuProblems: those `launch --wait` may wait out say so."""
    found = []
    for machine, tasks in cluster.machines():
        gpus = reported(reports, machine)
        found += host_problems(machine, tasks, reports)
        known = facts(reports, machine)
        for gpu in sorted({g for t in tasks if t.gpus_listed for g in devices(t)} & set(gpus)):
            why = blocker(known[gpu], machine, share) if gpu in known else None
            if why:
                slots = ", ".join(t.slot for t in tasks if t.gpus_listed and gpu in devices(t))
                found.append(GpuProblem("%s: GPU %d (tfcluster_gpus of %s) is %s: %s" % (
                    machine.label, gpu, slots, why[0], listed_fix(gpu, why)), why[1]))
        automatic = [t for t in tasks if not t.gpus_listed and t.job in TRAINING_JOBS]
        if gpus and automatic and not usable(reports, machine, share):
            found.append(no_free_gpu(machine, automatic, gpus, known, share))
        owner = {}
        for task in tasks:
            if not task.gpus_listed:
                continue
            for gpu in devices(task):
                if gpu not in gpus:
                    found.append("%s: tfcluster_gpus of %s lists GPU %d but nvidia-smi -L shows %s: "
                                 "fix tfcluster_gpus" % (machine.label, task.slot, gpu,
                                                         ", ".join(map(str, gpus)) or "no GPU"))
                elif gpu in owner and owner[gpu].slot != task.slot:
                    found.append("%s: %s and %s both list GPU %d in tfcluster_gpus: give each "
                                 "slot its own GPUs" % (machine.label, owner[gpu].slot, task.slot, gpu))
                owner.setdefault(gpu, task)
    return found


def task_env(task, cluster):
    """The GPU environment of TASK: what it sees, numbered as nvidia-smi does.

    Call it on assign()'s cluster: before assign() a task without listed GPUs has no decision
    and gets no CUDA_VISIBLE_DEVICES (it would see every GPU)."""
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if task.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = task.cuda_visible_devices
    if shares_gpu(task, cluster):
        # TensorFlow maps nearly all of a GPU's memory up front: two processes would not fit.
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    return env
