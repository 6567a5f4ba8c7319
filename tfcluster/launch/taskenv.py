"""What each task gets: its command, environment, threads and working folder."""
import json
import os

from tfcluster.runs.store import host_run_dir
from tfcluster.gpus import placement as gpus
from tfcluster.spec.catalog import task_command
from tfcluster_agent import datafiles
from tfcluster_agent import protocol as P
from tfcluster_agent.taskspec import TaskSpec


def thread_plan(cluster, reports, options):
    """Intra/inter-op threads per task: a fair share of the machine's cores."""
    plan = {}
    for machine, tasks in cluster.machines():
        report = reports.get(machine.key)
        cpus = int((report and report.cpus) or os.cpu_count() or 1)
        share = max(1, cpus // len(tasks))
        for task in tasks:
            # Two inter-op threads at least: ParameterServerStrategy deadlocks with one.
            plan[task.label] = (options.intra_op_threads or share, options.inter_op_threads or 2)
    return plan


def data_needs(cluster, options):
    """{machine key: [[data set, folder]]} the tasks read from disk, for preflight to check."""
    needs = {}
    for task in cluster.tasks:
        run_dir = host_run_dir(task.machine, "RUN-ID")
        command = task_command(options.example, cluster, task, run_dir, run_dir + "/checkpoints",
                               options.user_args, options.smoke)
        need = datafiles.needed(command, options.example.dataset)
        if need and list(need) not in needs.setdefault(task.machine.key, []):
            needs[task.machine.key].append(list(need))
    return needs


def task_specs(cluster, options, run_id, threads):
    """{task label: TaskSpec}: what the agent needs to start each task."""
    specs = {}
    example = options.example
    for task in cluster.tasks:
        machine = task.machine
        run_dir = host_run_dir(machine, run_id)
        checkpoint_dir = host_run_dir(machine, options.resume or run_id) + "/checkpoints"
        command = task_command(example, cluster, task, run_dir, checkpoint_dir,
                               options.user_args, options.smoke)
        intra, inter = threads[task.label]
        env = {"TF_CONFIG": json.dumps(cluster.tf_config(task), separators=(",", ":")),
               "TF_NUM_INTRAOP_THREADS": str(intra), "TF_NUM_INTEROP_THREADS": str(inter),
               "OMP_NUM_THREADS": str(intra), "PYTHONUNBUFFERED": "1",
               # TensorFlow's own default: its INFO lines reach the logs (`CreateSession still
               # waiting for response from worker: ...` names a peer a task waits for); the
               # console leaves them out (report.NOISE).
               "TF_CPP_MIN_LOG_LEVEL": "0",
               "TFCLUSTER_RUN_ID": run_id, "TFCLUSTER_TASK": task.label,
               "TFCLUSTER_RUN_DIR": run_dir,
               # Where the termination notice of a drain appears (the agent writes it).
               P.DRAIN_FILE_ENV: run_dir + "/" + P.DRAIN_FILE,
               # Where the new cluster appears when some tasks move and this one goes on.
               P.CLUSTER_FILE_ENV: run_dir + "/" + P.CLUSTER_FILE}
        env.update(gpus.task_env(task, cluster))
        env.update(options.env)
        if example.name == "custom":
            cwd = options.cwd or (os.getcwd() if machine.is_local else machine.root)
        else:
            cwd = run_dir
        specs[task.label] = TaskSpec(
            name=task.name, command=command, env=env, cwd=cwd,
            # stacks/ first: its sitecustomize lets the agent take the task's stacks (stall.py).
            env_prepend={"PATH": os.path.dirname(machine.python),
                         "PYTHONPATH": machine.root + "/tfcluster_agent/stacks:" + machine.root},
            # The agent claims the port for the task's life. It reports when a ps listens: the
            # workers may start at once, TensorFlow clients wait for their servers, but a ps
            # that never listens fails the run.
            port=task.port, await_listening=task.job == "ps", nice=options.nice)
    return specs
