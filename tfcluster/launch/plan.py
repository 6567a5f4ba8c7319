"""Which tasks a launch runs where, from the inventory's slots: decided before the launcher's
own modules are imported, so that the local agents start while they are (cli.cmd_launch)."""
from tfcluster.spec.catalog import check_templates
from tfcluster.errors import UsageError
from tfcluster.hosts.inventory import JOBS
from tfcluster.spec.cluster import build_cluster


def launch_counts(example, counts):
    """Tasks per job: the example's topology with the count flags COUNTS over it (a --cmd has
    the flags alone); None: every slot of the job."""
    if example.name == "custom":
        return dict(counts)
    return dict({job: example.topology.get(job, 0) for job in JOBS}, **counts)


def make_cluster(inventory_path, slots, counts, example, spares=0):
    have = {s.job for s in slots}
    for job, wanted in counts.items():
        if wanted and job not in have:
            raise UsageError("inventory %s has no [%s] group but %s needs %s %s task(s): add "
                             "one, or run an example it fits (tfcluster examples -i %s)"
                             % (inventory_path, job, example.name, wanted, job, inventory_path))
    cluster = build_cluster(slots, counts, example.task_per_gpu, spares)
    if not cluster.job_tasks("worker") and not cluster.job_tasks("chief"):
        raise UsageError("inventory %s has no [worker] or [chief] hosts: nothing would train"
                         % inventory_path)
    check_templates(example, cluster)
    return cluster
