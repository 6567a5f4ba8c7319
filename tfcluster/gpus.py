"""Which GPUs each task sees, decided per machine from what preflight's `nvidia-smi -L` reported.

Training tasks (chief, worker) get their own GPUs by default: the machine's GPUs that no slot
lists in tfcluster_gpus, split among its tasks that list none. ps and evaluator tasks see no GPU
unless their slot lists some. More tasks than GPUs: tasks share, with memory growth on.
"""
import dataclasses
import re

TRAINING_JOBS = ("chief", "worker")
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


def assign(cluster, reports):
    """A copy of CLUSTER where every task's cuda_visible_devices is set.

    REPORTS is {machine.key: preflight report}; a report's "gpus" holds nvidia-smi -L lines."""
    from tfcluster.spec import Cluster
    chosen = {}
    for machine, tasks in cluster.machines():
        gpus = reported(reports, machine)
        listed = {gpu for task in tasks if task.gpus_listed for gpu in devices(task)}
        free = [gpu for gpu in gpus if gpu not in listed] or gpus
        pending = [t for t in tasks if t.cuda_visible_devices is None and t.job in TRAINING_JOBS]
        for i, task in enumerate(pending):
            if len(free) >= len(pending):
                share = free[i * len(free) // len(pending):(i + 1) * len(free) // len(pending)]
            else:
                share = [free[i % len(free)]] if free else []
            chosen[task.label] = ",".join(map(str, share))
    return Cluster([dataclasses.replace(t, cuda_visible_devices=chosen.get(
        t.label, t.cuda_visible_devices if t.cuda_visible_devices is not None else ""))
        for t in cluster.tasks])


def shares_gpu(task, cluster):
    """True when another task on TASK's machine sees one of TASK's GPUs."""
    mine = set(devices(task))
    return bool(mine) and any(
        other.label != task.label and other.machine.key == task.machine.key and mine & set(devices(other))
        for other in cluster.tasks)


def problems(cluster, reports):
    """One line per GPU problem, naming the host and the fix; [] when every listed id is fine."""
    found = []
    for machine, tasks in cluster.machines():
        gpus = reported(reports, machine)
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
