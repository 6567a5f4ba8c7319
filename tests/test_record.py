"""The typed run model: run.json round trips, older records, task state transitions, and machines
found by Machine.key (two machines behind one address, on two SSH ports) on a fake host layer."""
import io
import json

import pytest

from support.fakehosts import FakeHosts, FakeLink
from tfcluster.spec import catalog
from tfcluster.cli import manage
from tfcluster.runs import store as runs
from tfcluster.errors import UsageError
from tfcluster.hosts.inventory import Machine, Slot
from tfcluster.launch.launcher import Launch
from tfcluster.launch.options import LaunchOptions
from tfcluster.runs.record import (FORMAT_VERSION, RecordError, RunRecord, RunState, TaskState,
                              check_transition)
from tfcluster.view.report import PlainReporter
from tfcluster.spec.cluster import build_cluster
from tfcluster_agent import protocol as P

# A record as the code before the run model wrote it (format 1: no "format", tasks by address).
FORMAT_1 = {
    "id": "old", "example": "custom", "state": "succeeded", "created": "2026-11-20T10:00:00+00:00",
    "success_policy": "all_workers", "cluster": {"worker": ["10.0.0.1:2222"]},
    "machines": [{"address": "10.0.0.1", "connection": "ssh", "ssh_port": 22, "user": None,
                  "root": "/opt/t", "tf_version": "2.21.0", "cpus": 4, "gpus": []}],
    "tasks": {"worker:0": {"job": "worker", "index": 0, "slot": "w0", "host": "10.0.0.1",
                           "port": 2222, "address": "10.0.0.1:2222", "name": "worker-0",
                           "state": "succeeded", "exit": 0, "restarts": 0, "pid": 42}},
    "results": {"worker:0": {"loss": 0.5}}, "exit_code": 0,
}


def test_a_format_1_record_loads_and_saves_as_the_current_format(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "run.json").write_text(json.dumps(FORMAT_1))
    record = runs.load(str(tmp_path), "old")
    entry = record.tasks["worker:0"]
    assert entry.machine == ("ssh", "10.0.0.1", 22, None) and entry.state is TaskState.SUCCEEDED
    assert record.machines[0].facts["tf_version"] == "2.21.0" and record.results["worker:0"]
    runs.save(record)
    saved = json.loads((tmp_path / "old" / "run.json").read_text())
    assert saved["format"] == FORMAT_VERSION
    assert RunRecord.from_json(saved, str(tmp_path)).to_json() == saved

# A record as tfcluster wrote it before the run model moved to the controller (format 2).
FORMAT_2 = {
    "format": 2, "id": "r2", "example": "mnist_replica", "state": "stopped",
    "created": "2026-11-25T10:00:00+00:00", "started": "2026-11-25T10:00:05+00:00",
    "ended": "2026-11-25T10:01:00+00:00", "inventory": "inventory/local.yml",
    "success_policy": "all_workers", "smoke": True, "user_args": ["--train_steps=10"],
    "detach": False, "cluster": {"ps": ["localhost:2222"], "worker": ["localhost:2223"]},
    "cluster_spec": "ps|localhost:2222,worker|localhost:2223", "code_hash": "ab" * 32,
    "machines": [{"address": "localhost", "connection": "local", "ssh_port": 22, "user": None,
                  "root": "/opt/t", "tf_version": "2.21.0", "hostname": "h", "cpus": 2,
                  "gpus": []}],
    "tasks": {label: {"job": job, "index": 0, "slot": slot, "port": port,
                      "machine": ["local", "localhost", 22, None], "host": "localhost",
                      "address": "localhost:%d" % port, "name": label.replace(":", "-"),
                      "command": "python -m trainers.mnist_replica", "env_names": ["TF_CONFIG"],
                      "intra_op_threads": 1, "state": state, "exit": code, "pid": 40 + port % 10,
                      "restarts": 0, "log": "%s.log" % label.replace(":", "-"),
                      "first_step_s": 1.5}
              for label, job, slot, port, state, code in (
                  ("worker:0", "worker", "w0", 2223, "succeeded", 0),
                  ("ps:0", "ps", "p0", 2222, "stopped", 143))},
    "results": {"worker:0": {"loss": 0.3, "accuracy": 0.9}},
    "restart_log": [{"task": "worker:0", "why": "exit 1", "scope": "task",
                     "time": "2026-11-25T10:00:30+00:00"}],
    "leftovers": [], "collection_problems": [], "exit_code": 0,
}


def test_a_format_2_record_loads_as_it_was_written(tmp_path):
    (tmp_path / "r2").mkdir()
    (tmp_path / "r2" / "run.json").write_text(json.dumps(FORMAT_2))
    record = runs.load(str(tmp_path), "r2")
    assert record.state is RunState.STOPPED and not record.active
    assert record.tasks["ps:0"].state is TaskState.STOPPED and record.tasks["ps:0"].exit == 143
    assert record.restart_log[0].why == "exit 1" and record.machines[0].facts["cpus"] == 2
    assert record.to_json() == FORMAT_2


def test_the_run_state_changes_only_as_its_transitions_allow():
    record = RunRecord(id="r")
    assert record.state is RunState.STARTING and record.active
    record.become("waiting")
    with pytest.raises(ValueError, match="run r cannot go from waiting to running"):
        record.become(RunState.RUNNING)  # a run that waited starts its tasks first
    record.become(RunState.STARTING)
    record.become(RunState.STARTING)  # no change
    record.become(RunState.RUNNING)
    assert record.state is RunState.RUNNING
    with pytest.raises(ValueError, match="run r cannot go from running to waiting"):
        record.become(RunState.WAITING)
    record.become(RunState.TIMED_OUT)
    assert not record.active and record.to_json()["state"] == "timed_out"
    for later in (RunState.RUNNING, RunState.SUCCEEDED, "waiting"):
        with pytest.raises(ValueError, match="cannot go from timed_out"):
            record.become(later)


def test_a_format_1_record_with_two_machines_on_one_address_fails_in_one_line(tmp_path, capsys):
    data = json.loads(json.dumps(FORMAT_1))
    data["machines"].append(dict(data["machines"][0], ssh_port=2200))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "run.json").write_text(json.dumps(data))
    with pytest.raises(UsageError) as caught:
        runs.load(str(tmp_path), "old")
    message = str(caught.value)
    assert "\n" not in message and "2 machines share the address 10.0.0.1" in message


@pytest.mark.parametrize("data, problem", [
    ([], "not a JSON object"),
    ({"id": "x", "format": 99}, "newer than this tfcluster reads"),
    ({"id": "x", "machines": {}}, "bad machines"),
    ({"id": "x", "state": "paused"}, "unknown run state 'paused'"),
    ({"id": "x", "tasks": {"worker:0": {"job": "worker"}}}, "task worker:0 incomplete"),
    ({"id": "x", "tasks": {"worker:0": {"job": "worker", "index": 0, "slot": "s", "port": 1,
                                        "machine": ["ssh", "h", 22, None]}}},
     "on unknown machine"),
])
def test_unusable_records_say_why(data, problem):
    with pytest.raises(RecordError, match=problem):
        RunRecord.from_json(data)


def test_an_ending_is_final_and_pending_only_a_beginning():
    assert check_transition("worker:0", TaskState.PENDING, "running") is TaskState.RUNNING
    assert check_transition("worker:0", TaskState.EXITED, TaskState.RUNNING)  # a restart
    with pytest.raises(ValueError, match="worker:0 cannot go from succeeded to running"):
        check_transition("worker:0", TaskState.SUCCEEDED, TaskState.RUNNING)
    with pytest.raises(ValueError):
        check_transition("worker:0", TaskState.RUNNING, TaskState.PENDING)
    assert TaskState.STOPPED.is_terminal and TaskState.RESTARTING.is_running
    assert not TaskState.EXITED.is_terminal


class AttachingLink(FakeLink):
    """A fake agent that also answers attach (the tasks it runs are alive)."""

    def request(self, msg, timeout, what="", collect=None):
        if isinstance(msg, P.Attach):
            return P.Attached(tasks={name: {"pid": 7, "alive": True, "exit": None,
                                            "state": "running"} for name in self.alive})
        return super().request(msg, timeout, what, collect)


def two_machines_one_address():
    machines = [Machine(address="127.0.0.1", connection="ssh", ssh_port=port, root="/opt/t",
                        python="/opt/t/venv/bin/python", workdir="/opt/t/work")
                for port in (24201, 24202)]
    slots = [Slot(name="w%d" % i, job="worker", machine=m, port=None, port_base=2222)
             for i, m in enumerate(machines)]
    return build_cluster(slots, {"worker": 2, "ps": 0, "chief": 0, "evaluator": 0})


def test_two_machines_behind_one_address_are_two_to_status_logs_and_stop(tmp_path, monkeypatch):
    cluster = two_machines_one_address()
    hosts = FakeHosts([m for m, _ in cluster.machines()])
    for key, link in hosts.links.items():
        hosts.links[key] = AttachingLink(link.machine, hosts.events, {}, link.report)
    runs_dir = str(tmp_path / "runs")
    example = catalog.custom_example("sleep 300", "all_workers")
    Launch(cluster, LaunchOptions(example=example, runs_dir=runs_dir, run_id="r", detach=True),
           "inventory.yml", PlainReporter(stream=io.StringIO()), hosts=hosts).run()
    links = {link.machine.ssh_port: link for link in hosts.links.values()}
    assert links[24201].alive == {"worker-0"} and links[24202].alive == {"worker-1"}

    record = runs.load(runs_dir, "r")
    assert {label: t.machine[2] for label, t in record.tasks.items()} == \
        {"worker:0": 24201, "worker:1": 24202}
    rebuilt = manage.cluster_from_record(record)
    assert [t.machine.ssh_port for t in rebuilt.tasks] == [24201, 24202]

    # status, logs and stop open the record's machines, each by its own key.
    monkeypatch.setattr(manage, "Hosts", lambda machines: hosts)
    console = io.StringIO()
    manage.status(runs_dir, "r", PlainReporter(stream=console))
    rows = [line.split() for line in console.getvalue().splitlines()
            if line.startswith("worker:")]
    assert [(row[1], row[3]) for row in rows] == [("127.0.0.1:24201", "running"),
                                                  ("127.0.0.1:24202", "running")]
    manage.stop(runs_dir, "r", grace=1, reporter=PlainReporter(stream=console))
    assert not links[24201].alive and not links[24202].alive
    record = runs.load(runs_dir, "r")
    assert record.state == "stopped" and not record.leftovers
    assert {t.state for t in record.tasks.values()} == {TaskState.STOPPED}


def test_the_monitor_is_the_only_writer_of_task_state():
    from tfcluster.launch.monitor import Monitor
    cluster = two_machines_one_address()
    hosts = FakeHosts([m for m, _ in cluster.machines()])
    monitor = Monitor(hosts, cluster, None, PlainReporter(stream=io.StringIO()))
    worker = cluster.tasks[0]
    monitor.handle(worker.machine.key, P.Started(name=worker.name, pid=5, time=0.0))
    with pytest.raises(TypeError):
        monitor.states[worker.label] = None  # a read-only view
    monitor.handle(worker.machine.key, P.Exited(name=worker.name, code=3, state="exited"))
    assert (monitor.states[worker.label].state, monitor.states[worker.label].exit) == \
        (TaskState.EXITED, 3)
    monitor.restarting(worker)
    assert monitor.alive(worker) and monitor.states[worker.label].state is TaskState.RESTARTING
    # An event names a task of the machine that sent it: one address, two machines.
    other = cluster.tasks[1]
    monitor.handle(worker.machine.key, P.Started(name=other.name, pid=7, time=0.0))
    assert other.label not in monitor.states
    monitor.handle(other.machine.key, P.Started(name=other.name, pid=6, time=0.0))
    assert monitor.states[other.label].pid == 6 and monitor.states[worker.label].pid == 5
