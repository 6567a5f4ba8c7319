"""The console reporters as a test drives and reads them: a task to report on, a live table as
text."""
import io

from rich.console import Console

from tfcluster.hosts.inventory import Machine
from tfcluster.spec.cluster import Task


def make_task(job="worker", index=0, host="10.0.0.12"):
    return Task(job=job, index=index, slot="%s%d" % (job, index), machine=Machine(address=host),
                port=2222)


def render(reporter, width=140):
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(reporter.render())
    return console.file.getvalue()
