"""Shared GPU servers: busy and unhealthy GPUs, claims across runs and users, the --wait queue,
`tfcluster gpus`. No GPU needed: tests/programs/nvidia-smi answers nvidia-smi's query interface
from a state file each test writes (fresh GPU UUIDs each time, so claims never collide with
another test session's)."""
import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from support import REPO
from support.cli import local_inventory_text, run_record, stopped_by_lease, tfcluster
from support.gpus import FAKE_SMI, FakeGpus, local_slots, outcomes_of, reports_for
from support.ports import free_port_block
from support.procs import parent_of, processes_matching, stop_leftovers, wait_for
from tfcluster.gpus import placement as gpus
from tfcluster.hosts.inventory import Machine, Slot, load_slots
from tfcluster.runs.record import PreflightReport
from tfcluster.spec.cluster import build_cluster
from tfcluster_agent import gpuclaims, gpuinfo
from tfcluster_agent import protocol as P
from tfcluster_agent.values import replace

FAKE_TASK = "python %s" % os.path.join(REPO, "tests", "programs", "fake_task.py")
# Prints the GPUs it was given, then behaves as fake_task (FAKE_WORKER_N).
SHOW_GPUS = "echo gpus=$CUDA_VISIBLE_DEVICES; exec " + FAKE_TASK


def inventory(tmp_path, workers=2, extra="", slot_vars=None, name="hosts.yml", port_base=None):
    """A local inventory of WORKERS worker slots on localhost (SLOT_VARS: {index: "k: v"})."""
    text = local_inventory_text(str(tmp_path / "work"), ps=0, workers=workers, chief=0,
                                extra=extra, port_base=port_base)
    for index, values in (slot_vars or {}).items():
        text = text.replace("worker%d: {ansible_host: localhost}" % index,
                            "worker%d: {ansible_host: localhost, %s}" % (index, values))
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ------------------------------------------------------------------ facts and placement

def test_facts_read_the_query_interface_and_proc(fake_gpus):
    pid = fake_gpus.use(0, mib=10240)
    fake_gpus.set(1, ecc="[N/A]", retired_pending="[Not Supported]", remap_failure="[N/A]",
                  utilization="[N/A]")
    fake_gpus.set(2, name="NVIDIA RTX A6000, rev. 2")
    facts = gpuinfo.host_gpus()
    assert facts["driver"] == "550.54.15" and facts["error"] is None
    first, second, third = facts["gpus"][:3]
    assert [g["index"] for g in facts["gpus"]] == [0, 1, 2, 3]
    assert first["processes"] == [{"pid": pid, "used_memory": 10240,
                                   "user": gpuclaims.user_name(), "command": "sleep 600"}]
    assert first["memory_used"] == 10241 and first["memory_total"] == 81920
    assert second["ecc_errors"] is None and second["retired_pending"] is None
    assert second["remap_failed"] is None and second["utilization"] is None
    assert third["name"] == "NVIDIA RTX A6000, rev. 2"


def test_no_driver_is_an_error_no_nvidia_smi_a_host_without_gpus(fake_gpus, smi_in_process,
                                                                   monkeypatch):
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", "/nonexistent")
    assert gpuinfo.host_gpus() == {
        "driver": None, "gpus": [], "warning": None, "absent": None,
        "error": "nvidia-smi -L failed (exit 9): NVIDIA-SMI has failed because it couldn't "
                 "communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver "
                 "is installed and running."}
    absent = gpuinfo.host_gpus("/nonexistent/nvidia-smi")
    assert absent["gpus"] == [] and absent["error"] is None
    assert absent["absent"] == "/nonexistent/nvidia-smi: No such file or directory"


def test_assignment_skips_busy_and_unhealthy_gpus(fake_gpus, smi_in_process):
    fake_gpus.use(0)
    fake_gpus.set(3, ecc=2)
    cluster = build_cluster(local_slots(2))
    reports = reports_for(cluster)
    assert gpus.problems(cluster, reports) == []
    assigned = gpus.assign(cluster, reports)
    assert [t.cuda_visible_devices for t in assigned.tasks] == ["1", "2"]
    # Memory held by a process nvidia-smi does not show (another container) is busy too.
    fake_gpus.set(1, memory_used=900)
    fake_gpus.set(2, retired_pending="Yes")
    reports = reports_for(cluster)
    problems = gpus.problems(cluster, reports)
    assert len(problems) == 1 and problems[0].startswith("localhost: no free GPU for worker:0, "
                                                         "worker:1: GPU 0 busy, used by pid ")
    assert "GPU 1 busy, used by a process nvidia-smi does not show, 900 MiB (over " \
        "tfcluster_gpu_busy_mib, 300)" in problems[0]
    # GPUs 0 and 1 free themselves when their processes end; 2 and 3 are failing.
    assert problems[0].waitable and problems[0].endswith(
        ": wait for one (`tfcluster launch --wait`), or share a busy one knowingly "
        "(--share-busy-gpus or tfcluster_gpu_share: true)")
    # Knowingly sharing the busy ones: the unhealthy ones stay out.
    shared = gpus.assign(cluster, reports, share=True)
    assert [t.cuda_visible_devices for t in shared.tasks] == ["0", "1"]


def test_listed_busy_and_unhealthy_gpus_are_refused_one_line_each(fake_gpus, smi_in_process,
                                                                   tmp_path):
    pid = fake_gpus.use(0)
    fake_gpus.set(1, remap_failure="Yes")
    fake_gpus.set(2, ecc=3)
    fake_gpus.set(3, retired_pending="Yes")
    cluster = build_cluster(local_slots(2, {0: (0, 1), 1: (2, 3)}), task_per_gpu=False)
    problems = gpus.problems(cluster, reports_for(cluster))
    user = gpuclaims.user_name()
    assert problems == [
        "localhost: GPU 0 (tfcluster_gpus of worker0) is busy, used by pid %d (user %s: sleep "
        "600), 10240 MiB: wait for it (`tfcluster launch --wait`), list another GPU, or share "
        "it knowingly (--share-busy-gpus or tfcluster_gpu_share: true)" % (pid, user),
        "localhost: GPU 1 (tfcluster_gpus of worker0) is unhealthy: row remapping failed "
        "(remapped_rows.failure): replace the board or list another GPU in tfcluster_gpus",
        "localhost: GPU 2 (tfcluster_gpus of worker1) is unhealthy: 3 uncorrectable ECC "
        "error(s) (ecc.errors.uncorrected.volatile.total): replace the board or list another "
        "GPU in tfcluster_gpus",
        "localhost: GPU 3 (tfcluster_gpus of worker1) is unhealthy: retired pages pending a "
        "reset (retired_pages.pending): replace the board or list another GPU in tfcluster_gpus"]
    assert [p.waitable for p in problems] == [True, False, False, False]
    # The share setting of the inventory covers the busy one only.
    shared = build_cluster(load_slots(inventory(tmp_path, workers=1, slot_vars={
        0: "tfcluster_gpus: [0], tfcluster_gpu_share: true"})))
    assert gpus.problems(shared, reports_for(shared)) == []


def test_fewer_gpus_than_the_inventory_says_and_differing_drivers(fake_gpus, smi_in_process):
    cluster = build_cluster(local_slots(1, gpu_count=8))
    reports = reports_for(cluster)
    assert gpus.problems(cluster, reports) == [
        "localhost: nvidia-smi shows 4 GPU(s) but tfcluster_gpu_count says 8: check the host "
        "(nvidia-smi -L; a board may have fallen off the bus) or fix tfcluster_gpu_count"]
    assert gpus.warnings(cluster, reports) == []
    remote = local_slots(1, address="127.0.0.1")[0]
    two = build_cluster(local_slots(1) + [replace(remote, name="worker1")])
    reports = reports_for(two)
    other = [m for m, _ in two.machines()][1]
    reports[other.key].gpu_facts = dict(reports[other.key].gpu_facts, driver="535.183.01")
    assert gpus.warnings(two, reports) == [
        "NVIDIA driver versions differ (localhost=550.54.15, 127.0.0.1=535.183.01): deploy the "
        "same driver everywhere (nvidia_driver_branch) or expect different results and speeds"]


# ------------------------------------------------------------------ claims

def hold_claim(gpu_uuid, run, ready, release):
    claims = gpuclaims.GpuClaims()
    ready.put(claims.claim({gpu_uuid: ["worker-0"]}, run)["taken"] == {})
    release.wait(60)


def test_claim_files_open_to_every_user_whatever_the_umask(fake_gpus):
    old = os.umask(0o077)
    try:
        claims = gpuclaims.GpuClaims()
        assert claims.claim({fake_gpus.uuids()[0]: ["worker-0"]}, "r1") == {"taken": {},
                                                                              "ahead": []}
    finally:
        os.umask(old)
    folder = os.stat(gpuclaims.CLAIMS_DIR)
    assert stat.S_IMODE(folder.st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(gpuclaims.claim_path(fake_gpus.uuids()[0])).st_mode) == 0o666
    assert gpuclaims.holder(fake_gpus.uuids()[0])["run"] == "r1"
    claims.release()
    assert gpuclaims.holder(fake_gpus.uuids()[0]) is None


def test_the_race_for_the_last_gpu_has_exactly_one_winner(fake_gpus):
    context = multiprocessing.get_context("fork")
    ready, release = context.Queue(), context.Event()
    racers = [context.Process(target=hold_claim, args=(fake_gpus.uuids()[3], "r%d" % i, ready,
                                                       release)) for i in range(12)]
    for racer in racers:
        racer.start()
    try:
        won = [ready.get(timeout=60) for _ in racers]
    finally:
        release.set()
        for racer in racers:
            racer.join(30)
    assert won.count(True) == 1, won


def test_a_killed_holder_leaves_no_claim(fake_gpus):
    gpu_uuid = fake_gpus.uuids()[0]
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, %r)\n"
        "from tfcluster_agent import gpuclaims\n"
        "c = gpuclaims.GpuClaims(); print(c.claim({%r: ['worker-0']}, 'doomed'), flush=True)\n"
        "time.sleep(600)") % (REPO, gpu_uuid)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().startswith("{'taken': {}")
        assert gpuclaims.holder(gpu_uuid)["run"] == "doomed"
        taken = gpuclaims.GpuClaims().claim({gpu_uuid: ["worker-0"]}, "next")["taken"]
        assert taken[gpu_uuid]["run"] == "doomed"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    claims = gpuclaims.GpuClaims()
    assert claims.claim({gpu_uuid: ["worker-0"]}, "next") == {"taken": {}, "ahead": []}
    claims.release()


def test_the_queue_is_first_come_first_served(fake_gpus):
    gpu_uuid = fake_gpus.uuids()[0]
    want = {gpu_uuid: ["worker-0"]}
    holder, first, second = (gpuclaims.GpuClaims() for _ in range(3))
    assert holder.claim(want, "holder")["taken"] == {}
    assert first.claim(want, "first", wait=True)["taken"][gpu_uuid]["run"] == "holder"
    # Tickets sort by time, then pid, then run name: "first" comes first even at one time.
    waiting = second.claim(want, "second", wait=True)
    assert [a["run"] for a in waiting["ahead"]] == ["first"]
    # Without --wait a run does not jump the queue either.
    assert [a["run"] for a in gpuclaims.GpuClaims().claim(want, "rude")["ahead"]] == [
        "first", "second"]
    holder.release()
    assert [a["run"] for a in second.claim(want, "second", wait=True)["ahead"]] == ["first"]
    assert first.claim(want, "first", wait=True) == {"taken": {}, "ahead": []}
    assert second.claim(want, "second", wait=True)["taken"][gpu_uuid]["run"] == "first"
    first.release()
    assert second.claim(want, "second", wait=True) == {"taken": {}, "ahead": []}
    second.release()


def test_a_dead_waiter_does_not_hold_the_queue(fake_gpus):
    want = {fake_gpus.uuids()[1]: ["worker-0"]}
    waiter = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, %r)\n"
        "from tfcluster_agent import gpuclaims\n"
        "h = gpuclaims.GpuClaims(); h.claim(%r, 'holder')\n"
        "w = gpuclaims.GpuClaims(); print(w.claim(%r, 'dead', wait=True), flush=True)\n"
        "time.sleep(600)") % (REPO, want, want)], stdout=subprocess.PIPE, text=True)
    try:
        assert "'run': 'holder'" in waiter.stdout.readline()
        assert [a["run"] for a in gpuclaims.GpuClaims().claim(want, "me")["ahead"]] == ["dead"]
    finally:
        waiter.send_signal(signal.SIGKILL)
        waiter.wait()
    claims = gpuclaims.GpuClaims()
    assert claims.claim(want, "me") == {"taken": {}, "ahead": []}
    claims.release()


def test_stop_of_a_waiting_run_whose_launcher_died(tmp_path):
    from tfcluster.gpus import claims as gpuqueue
    from tfcluster.runs import store as runs
    from tfcluster.view.report import PlainReporter
    gone = subprocess.Popen(["true"])
    gone.wait()
    record = runs.create(str(tmp_path), "w1")
    record.state, record.waiting = "waiting", {"pid": gone.pid, "start": 1}
    runs.save(record)
    assert gpuqueue.stop_waiting(runs.load(str(tmp_path), "w1"), PlainReporter(echo=False))
    assert run_record(str(tmp_path), "w1")["state"] == "stopped"
    assert not gpuqueue.stop_waiting(runs.load(str(tmp_path), "w1"), PlainReporter(echo=False))


# ------------------------------------------------------------------ launches (local agents)

def launch(inv, runs_dir, *extra, env=None, run_id=None):
    argv = [sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir, "launch", "--cmd",
            SHOW_GPUS, "-i", inv, "--plain"] + (["--run-id", run_id] if run_id else [])
    argv += list(extra)
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, **(env or {})))


def running(runs_dir, run_id):
    try:
        return run_record(runs_dir, run_id)["state"] == "running"
    except (AssertionError, OSError, ValueError):
        return False


def finish(proc, timeout=120):
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, out, err


@pytest.mark.slow
def test_launch_places_workers_around_busy_and_unhealthy_gpus_and_wait_queues_by_count(
        fake_gpus, tmp_path):
    """GPU 0 busy, GPU 3 failing, and a driver that does not know retired_pages.pending: the
    first run's two workers get GPUs 1 and 2, with a warning naming the field. A second run with
    --wait waits for them (the failing board does not make it refuse) and starts on them when
    the first run ends."""
    fake_gpus.use(0)
    fake_gpus.set(3, ecc=1)
    fake_gpus.state["unknown_fields"] = ["retired_pages.pending"]
    fake_gpus.save()
    runs_dir, base = str(tmp_path / "runs"), free_port_block()
    first = launch(inventory(tmp_path, port_base=base), runs_dir, "--success", "all_workers",
                   run_id="first", env={"FAKE_WORKER_0": "forever", "FAKE_WORKER_1": "forever"})
    second = None
    try:
        wait_for(lambda: running(runs_dir, "first"), 90, "the first run to run")
        second = launch(inventory(tmp_path, workers=1, name="second.yml", port_base=base + 10),
                        runs_dir, "--wait", run_id="second")
        wait_for(lambda: os.path.exists(os.path.join(runs_dir, "second", "run.json")), 90,
                 "the second run to wait")
        tfcluster("stop", "first", runs_dir=runs_dir, check=0)
        _, out, err = finish(first)
        shown = sorted(line.split("] gpus=")[1] for line in out.splitlines() if "] gpus=" in line)
        assert shown == ["1", "2"], out
        assert 'tfcluster: warning: localhost: nvidia-smi answers `Field "retired_pages.pending" ' \
            'is not a valid field to query.`' in out + err
        code, out, err = finish(second)
        assert code == 0, out + err
        says = [line for line in out.splitlines() if "waits (--wait" in line]
        assert len(says) == 1 and "no free GPU for worker:0: GPU 0 busy, used by pid " in says[0] \
            and "; GPU 3 unhealthy: 1 uncorrectable ECC error(s)" in says[0], out
        assert [line.split("] gpus=")[1] for line in out.splitlines() if "] gpus=" in line] == [
            "1,2"], out
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
    assert all(gpuclaims.holder(u) is None for u in fake_gpus.uuids())


@pytest.mark.slow
def test_launch_refuses_listed_busy_and_unhealthy_gpus(fake_gpus, tmp_path):
    pid = fake_gpus.use(0)
    fake_gpus.set(1, ecc=5)
    runs_dir = str(tmp_path / "runs")
    inv = inventory(tmp_path, slot_vars={0: "tfcluster_gpus: [0]", 1: "tfcluster_gpus: [1]"})
    code, out, err = finish(launch(inv, runs_dir))
    assert code == 3, out + err
    assert err.splitlines() == [
        "tfcluster: error: preflight failed, nothing started:",
        "  localhost: GPU 0 (tfcluster_gpus of worker0) is busy, used by pid %d (user %s: sleep "
        "600), 10240 MiB: wait for it (`tfcluster launch --wait`), list another GPU, or share it "
        "knowingly (--share-busy-gpus or tfcluster_gpu_share: true)" % (pid, gpuclaims.user_name()),
        "  localhost: GPU 1 (tfcluster_gpus of worker1) is unhealthy: 5 uncorrectable ECC "
        "error(s) (ecc.errors.uncorrected.volatile.total): replace the board or list another GPU "
        "in tfcluster_gpus"]
    assert "gpus=" not in out and not (os.path.exists(runs_dir) and os.listdir(runs_dir))
    # Knowingly sharing the busy one; the failing one stays refused.
    code, out, err = finish(launch(inv, runs_dir, "--share-busy-gpus"))
    assert code == 3 and "GPU 0" not in err and "GPU 1" in err


@pytest.mark.slow
def test_second_run_refused_then_queued_and_started_when_the_first_ends(fake_gpus, tmp_path):
    runs_dir = str(tmp_path / "runs")
    base = free_port_block()
    first = launch(inventory(tmp_path, workers=4, port_base=base), runs_dir, run_id="first",
                   env={"FAKE_WORKER_%d" % i: "forever" for i in range(4)})
    try:
        wait_for(lambda: running(runs_dir, "first"), 90, "the first run to run")
        assert {gpuclaims.holder(u)["run"] for u in fake_gpus.uuids()} == {"first"}
        # Other ports: the GPUs alone stand in the way.
        inv = inventory(tmp_path, workers=1, name="second.yml", port_base=base + 10)
        code, out, err = finish(launch(inv, runs_dir, run_id="refused"))
        assert code == 3, out + err
        user = gpuclaims.user_name()
        assert err.splitlines()[1] == (
            "  localhost: no free GPU for worker:0: GPU 0 claimed by run first (user {0}, task "
            "worker-0); GPU 1 claimed by run first (user {0}, task worker-1); GPU 2 claimed by "
            "run first (user {0}, task worker-2); GPU 3 claimed by run first (user {0}, task "
            "worker-3): wait for one (`tfcluster launch --wait`)".format(user)), err
        # Four runs wait, in this order: queued and later both for GPU 0, stopped and
        # interrupted for any; the last two give up.
        def waiter(run_id, port, listed=None):
            proc = launch(inventory(tmp_path, workers=1, name=run_id + ".yml", port_base=port,
                                    slot_vars={0: listed} if listed else None),
                          runs_dir, "--wait", run_id=run_id)
            wait_for(lambda: os.path.exists(os.path.join(runs_dir, run_id, "run.json")), 90,
                     "%s to wait" % run_id)
            return proc

        procs = []
        try:
            for run_id, port, listed in (("queued", base + 11, "tfcluster_gpus: [0]"),
                                         ("later", base + 12, "tfcluster_gpus: [0]"),
                                         ("stopped", base + 13, None),
                                         ("interrupted", base + 14, None)):
                procs.append(waiter(run_id, port, listed))
            queued, later, stopped, interrupted = procs
            stop = tfcluster("stop", "stopped", runs_dir=runs_dir, check=0)
            assert "it was waiting for GPUs; it stopped" in stop.stdout
            interrupted.send_signal(signal.SIGINT)
            for proc, run_id in ((stopped, "stopped"), (interrupted, "interrupted")):
                code, out, err = finish(proc)
                assert code == 130 and not os.path.exists(os.path.join(runs_dir, run_id)), err
            tfcluster("stop", "first", runs_dir=runs_dir, check=0)
            code, out, err = finish(queued)
            assert code == 0, out + err
            says = [line for line in out.splitlines() if "waits (--wait" in line]
            assert len(says) == 1 and "GPU 0 (tfcluster_gpus of worker0) is claimed by run " \
                "first" in says[0], out
            assert "its GPUs and ports are free now, starting" in out
            code, later_out, err = finish(later)
            assert code == 0, later_out + err
            # It waited behind queued, which began waiting first, for the same GPU.
            assert "1 run(s) wait for its GPUs before this one (run queued" in later_out
            assert run_record(runs_dir, "later")["started"] >= run_record(runs_dir,
                                                                           "queued")["ended"]
        finally:
            for proc in procs:
                proc.kill()
        assert run_record(runs_dir, "queued")["state"] == "succeeded"
    finally:
        first.kill()
    assert all(gpuclaims.holder(u) is None for u in fake_gpus.uuids())
    # No waiter is left in the queue either: a new run is ahead of nobody of ours.
    left = gpuclaims.GpuClaims().queue_ahead("check", wait=False)
    assert not [a for a in left if a.get("run") in ("queued", "later", "stopped", "interrupted")]


@pytest.mark.slow
def test_claims_go_when_launcher_and_agent_are_killed(fake_gpus, tmp_path):
    runs_dir, tmp = str(tmp_path / "runs"), tmp_path / "tmp"
    tmp.mkdir()
    first = launch(inventory(tmp_path), runs_dir, run_id="doomed",
                   env={"FAKE_WORKER_0": "forever", "FAKE_WORKER_1": "forever",
                        "TMPDIR": str(tmp)})
    try:
        wait_for(lambda: running(runs_dir, "doomed"), 90, "the run to run")
        record = run_record(runs_dir, "doomed")
        held = [u for u in fake_gpus.uuids() if gpuclaims.holder(u)]
        assert len(held) == 4
        # The agent, not its task supervisors: forks of it, under the same command line, they
        # are what stops the tasks when the lease runs out, and gives their claims back.
        agents = [pid for pid, cmd in processes_matching(str(tmp_path))
                  if "tfcluster_agent serve" in cmd and parent_of(pid) == first.pid]
        assert len(agents) == 1, processes_matching(str(tmp_path))
        for pid in [first.pid] + agents:
            os.kill(pid, signal.SIGKILL)
        first.wait()
        wait_for(lambda: stopped_by_lease(record), 60, "the tasks to stop after the lease")
        wait_for(lambda: not any(gpuclaims.holder(u) for u in held), 30, "the claims to go")
        for label, task in record["tasks"].items():  # stopped by their supervisors
            with open(os.path.join(task["host_run_dir"], label.replace(":", "-") + ".log")) as log:
                assert "controller lease expired, stopping the task" in log.read(), label
        # Each supervisor removed its task's own TMPDIR as it ended.
        wait_for(lambda: not os.listdir(tmp), 10, "the tasks' TMPDIRs to go")
    finally:
        first.kill()


# ------------------------------------------------------------------ another Unix user (root)

class AgentAs:
    """tfcluster's agent run as another Unix user (runuser), spoken to over its pipes: the host
    side of that user's launch. (That user cannot run this checkout's controller: its
    interpreter lives under /root. The agent is standard library only: /usr/bin/python3.)"""

    def __init__(self, user, env, code):
        self.proc = subprocess.Popen(
            ["runuser", "-u", user, "--", "env", "PATH=/usr/bin:/bin"] +
            ["%s=%s" % item for item in env.items()] +
            ["/usr/bin/python3", os.path.join(code, "tfcluster_agent", "agent.py"), "serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
        assert self.answer("hello")

    def answer(self, kind):
        while True:
            line = self.proc.stdout.readline()
            assert line, "the agent ended"
            msg = P.decode(line)
            if msg.kind in (kind, "error"):
                return msg

    def ask(self, msg):
        self.proc.stdin.write(P.encode(msg))
        self.proc.stdin.flush()
        reply = self.answer("report")
        assert reply.kind == "report", reply
        return reply.report

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.mark.root
@pytest.mark.slow
def test_a_claim_holds_against_another_unix_user(tmp_path, monkeypatch, readable_copy):
    """Root's run holds GPUs 0-1; another user's agent sees them held and is refused, naming
    the run and root; once the run ends that user claims them (root's lock files) and a GPU
    no one claimed before (its own file), which root can claim in turn."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second Unix user")
    import tempfile
    user = "tfcgpu%d" % os.getpid()
    shared = tempfile.mkdtemp(prefix="tfc-gpu-users-")  # the state file, readable by both
    os.chmod(shared, 0o755)
    fake = FakeGpus(os.path.join(shared, "gpus.json"), count=3)
    os.chmod(fake.path, 0o644)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(FAKE_SMI, bin_dir / "nvidia-smi")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", fake.path)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", user],
                   check=True)
    runs_dir = str(tmp_path / "runs")
    first = agent = None
    try:
        first = launch(inventory(tmp_path, workers=2, slot_vars={0: "tfcluster_gpus: [0]",
                                                                 1: "tfcluster_gpus: [1]"}),
                       runs_dir, run_id="roots-run",
                       env={"FAKE_WORKER_0": "forever", "FAKE_WORKER_1": "forever"})
        wait_for(lambda: running(runs_dir, "roots-run"), 90, "root's run to run")
        # That user's own copy of the agent and of the fake nvidia-smi: it may not be able to
        # enter the checkout (root's home is 0700).
        code = readable_copy("tfcluster_agent", "tests/programs/nvidia-smi")
        agent = AgentAs(user, fake.env(), code)
        report = agent.ask(P.Preflight(python="/usr/bin/python3", ports=[], code_dir=code,
                                       nvidia_smi=os.path.join(code, "tests/programs/nvidia-smi")))
        facts = report["gpu_facts"]["gpus"]
        assert [(g["claim"] or {}).get("user") for g in facts] == ["root", "root", None]
        machine = Machine(address="localhost", connection="local")
        cluster = build_cluster([Slot("w0", "worker", machine, port_base=free_port_block(),
                                      gpus=(0,))])
        assert gpus.problems(cluster, {machine.key: PreflightReport.from_json(report)}) == [
            "localhost: GPU 0 (tfcluster_gpus of w0) is claimed by run roots-run (user root, "
            "task worker-0): wait for it (`tfcluster launch --wait`), list another GPU"]
        taken = agent.ask(P.ClaimGpus(run="theirs", gpus={facts[1]["uuid"]: ["worker-0"]}))
        assert taken["taken"][facts[1]["uuid"]]["user"] == "root"
        tfcluster("stop", "roots-run", runs_dir=runs_dir, check=0)
        first.wait(60)
        everything = {g["uuid"]: ["worker-0"] for g in facts}
        assert agent.ask(P.ClaimGpus(run="theirs", gpus=everything)) == {"taken": {},
                                                                          "ahead": []}
        mine = gpuclaims.GpuClaims().claim(everything, "root-again")
        assert set(mine["taken"]) == set(everything)
        assert {h["user"] for h in mine["taken"].values()} == {user}
        agent.close()
        agent = None
        fresh = os.stat(gpuclaims.claim_path(facts[2]["uuid"]))
        assert pwd_name(fresh.st_uid) == user and stat.S_IMODE(fresh.st_mode) == 0o666
        claims = gpuclaims.GpuClaims()
        assert claims.claim(everything, "root-again") == {"taken": {}, "ahead": []}
        claims.release()
    finally:
        if agent is not None:
            agent.proc.stdin.close()  # the agent ends when its controller leaves
            try:
                agent.proc.wait(30)
            finally:
                agent.proc.kill()
        for pid in processes_of(user):
            os.kill(pid, signal.SIGKILL)
        if first is not None:
            first.kill()
        fake.close()
        stop_leftovers(str(tmp_path))
        subprocess.run(["userdel", user], check=False)
        import shutil
        shutil.rmtree(shared, ignore_errors=True)


def processes_of(user):
    import pwd
    uid = pwd.getpwnam(user).pw_uid
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and stat_uid(p) == uid]


def stat_uid(pid):
    try:
        return os.stat("/proc/" + pid).st_uid
    except OSError:
        return None


def pwd_name(uid):
    import pwd
    return pwd.getpwuid(uid).pw_name


# ------------------------------------------------------------------ tfcluster gpus


def table_rows(text):
    """The table's rows, each split on runs of 2+ spaces."""
    import re
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()
            if line.strip() and not line.startswith(("\033", "HOST"))]


def test_gpus_table_rows_for_unreachable_and_gpu_less_hosts():
    from tfcluster.gpus import table as gpustable
    from tfcluster.hosts.links import HostError
    down, bare, broken = (Machine(address=a) for a in ("gpu07", "cpu01", "gpu08"))
    table, notes = gpustable.rows([down, bare, broken], outcomes_of({
        down.key: HostError(down, "cannot connect: timed out"),
        bare.key: {"driver": None, "gpus": [], "error": None,
                   "absent": "nvidia-smi: No such file or directory"},
        broken.key: {"driver": None, "gpus": [], "absent": None,
                     "error": "nvidia-smi -L failed (exit 6): No devices were found"}}))
    lines = gpustable.render(table).splitlines()
    assert lines[1].startswith("gpu07  -    unreachable:")
    assert "cannot connect: timed out" in lines[1]
    assert lines[2].startswith("cpu01  -    no GPU (nvidia-smi: No such file or directory)")
    assert lines[3].startswith("gpu08  -    ERROR: nvidia-smi -L failed (exit 6): No devices "
                               "were found")
    assert notes == []


def test_gpus_watch_ends_on_ctrl_c_in_a_process_started_with_sigint_ignored(monkeypatch):
    """A background job (`&`) of a shell without job control starts with SIGINT ignored (a test
    session run that way, and so its `--watch`, looped on after its Ctrl-C); the watch takes
    SIGINT itself and puts the disposition it found back."""
    import contextlib
    import types
    from tfcluster.gpus import table as gpustable
    host = Machine(address="localhost", connection="local")
    monkeypatch.setattr(gpustable, "Hosts", lambda machines: contextlib.nullcontext())
    monkeypatch.setattr(gpustable, "query", lambda hosts, machines: outcomes_of({host.key: {
        "driver": None, "gpus": [], "error": None, "absent": "nvidia-smi: not found"}}))

    class Screen:
        tables = 0

        def write(self, text):
            if text.startswith(gpustable.CLEAR):
                self.tables += 1
                assert self.tables < 5, "--watch went on after its Ctrl-C"
                if self.tables == 2:
                    os.kill(os.getpid(), signal.SIGINT)

        def flush(self):
            pass

    screen = Screen()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert gpustable.show([types.SimpleNamespace(machine=host)], 0.01, screen) == 0
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert screen.tables == 2


def test_closing_a_local_agent_that_does_not_end_kills_it_and_what_it_started(tmp_path,
                                                                               monkeypatch):
    """Ctrl-C during a query of a stuck driver: the watch ends without leaving the agent (or its
    nvidia-smi) to run on. The "agent" here is a shell that never reads its stdin."""
    import queue
    from support.procs import pid_alive
    from tfcluster.hosts import links as hosts
    pid_file = tmp_path / "child.pid"
    monkeypatch.setattr(hosts, "agent_argv", lambda python, package_dir: [
        "sh", "-c", "sleep 60 & echo $! > %s; wait" % pid_file])
    monkeypatch.setattr(hosts.AgentLink, "CLOSE_WAIT", 0.2)
    link = hosts.AgentLink(Machine(address="localhost", connection="local"), queue.Queue())
    link.spawn()
    try:
        wait_for(lambda: pid_file.read_text().strip() if pid_file.exists() else "", 10,
                 "the busy agent's child to start")
        child = int(pid_file.read_text())
        link.close()
        assert link._proc.returncode is not None
        wait_for(lambda: not pid_alive(child), 5, "the agent's child to be gone")
    finally:
        try:  # without the kill on close: the shell and its sleep
            os.killpg(link._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        link._proc.wait()


@pytest.mark.slow
def test_gpus_table_and_watch(fake_gpus, tmp_path):
    pid = fake_gpus.use(1, mib=2048)
    fake_gpus.set(2, retired_pending="Yes", utilization=55)
    holder = gpuclaims.GpuClaims()
    # Refused while another test session's run waits in this host's queue (it is host-wide).
    assert holder.claim({fake_gpus.uuids()[3]: ["worker-1"]}, "20261125-demo") == {
        "taken": {}, "ahead": []}
    try:
        proc = tfcluster("gpus", "-i", inventory(tmp_path), check=0)
        assert table_rows(proc.stdout) == [
            ["localhost", "0", "NVIDIA A100-SXM4-80GB", "1/81920", "0%", "ok", "free"],
            ["localhost", "1", "NVIDIA A100-SXM4-80GB", "2049/81920", "0%", "ok",
             "pid %d (user %s: sleep 600), 2048 MiB" % (pid, gpuclaims.user_name())],
            ["localhost", "2", "NVIDIA A100-SXM4-80GB", "1/81920", "55%",
             "FAILING: retired pages pending", "free"],
            ["localhost", "3", "NVIDIA A100-SXM4-80GB", "1/81920", "0%", "ok",
             "run 20261125-demo (user %s, task worker-1)" % gpuclaims.user_name()]]
        watch = subprocess.Popen([sys.executable, "-m", "tfcluster", "gpus", "-i",
                                  inventory(tmp_path), "--watch", "0.2"], cwd=REPO,
                                 stdout=subprocess.PIPE, text=True)
        try:
            seen = []
            while len([line for line in seen if line.startswith("\033[H\033[J")]) < 3:
                line = watch.stdout.readline()
                assert line, "--watch ended by itself"
                seen.append(line)
            holder.release()

            def gpu3_free():  # the next line of the refreshing table
                line = watch.stdout.readline()
                return line.startswith("localhost  3 ") and line.rstrip().endswith("free")

            wait_for(gpu3_free, 30, "GPU 3 to show free once its claim is released", interval=0)
            watch.send_signal(signal.SIGINT)
            # Read to the end: a watcher blocked on a full pipe could not end.
            watch.communicate(timeout=30)
            assert watch.returncode == 0
        finally:
            watch.kill()
    finally:
        holder.release()


@pytest.mark.root
@pytest.mark.slow
def test_gpus_table_on_the_test_hosts(testhosts, tmp_path):
    """Each test host answers with its own GPUs (the fake nvidia-smi picks its state file by
    host name); the controller's one table holds them all, and a host whose driver does not
    answer is an error (exit 1)."""
    hosts = testhosts.hosts[:3]
    states = tmp_path / "states"
    states.mkdir()
    fakes = {name: FakeGpus(states / ("%s.json" % name), count=count)
             for (name, _), count in zip(hosts, (2, 1))}  # the third host has no driver
    wrapper = tmp_path / "nvidia-smi"
    wrapper.write_text('#!/bin/sh\nFAKE_NVIDIA_SMI_STATE=%s/$(hostname).json exec '
                       '/usr/bin/python3 %s "$@"\n' % (states, FAKE_SMI))
    wrapper.chmod(0o755)
    (first, _), (second, _), (third, _) = hosts
    pid = fakes[first].use(1, mib=4096)
    fakes[second].set(0, ecc=7)
    lines = ["all:", "  vars:", "    ansible_user: root",
             "    ansible_ssh_private_key_file: %s" % testhosts.key,
             "    tfcluster_known_hosts: %s" % testhosts.known_hosts,
             "    tfcluster_root: %s" % REPO, "    tfcluster_python: %s" % sys.executable,
             "    tfcluster_nvidia_smi: %s" % wrapper,
             "  children:", "    worker:", "      hosts:"]
    lines += ["        %s: {ansible_host: %s}" % host for host in hosts]
    inv = tmp_path / "gpus.yml"
    inv.write_text("\n".join(lines) + "\n")
    try:
        proc = tfcluster("gpus", "-i", str(inv), check=1)  # the third host's nvidia-smi fails
    finally:
        for fake in fakes.values():
            fake.close()
    addresses = dict(hosts)
    assert table_rows(proc.stdout) == [
        [addresses[first], "0", "NVIDIA A100-SXM4-80GB", "1/81920", "0%", "ok", "free"],
        [addresses[first], "1", "NVIDIA A100-SXM4-80GB", "4097/81920", "0%", "ok",
         "pid %d (user root: sleep 600), 4096 MiB" % pid],
        [addresses[second], "0", "NVIDIA A100-SXM4-80GB", "1/81920", "0%",
         "FAILING: ECC errors: 7", "free"],
        [addresses[third], "-", "ERROR: nvidia-smi -L failed (exit 9): NVIDIA-SMI has failed "
         "because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
         "NVIDIA driver is installed and running."]], proc.stdout


@pytest.mark.slow
def test_check_reports_missing_gpus_and_differing_drivers(fake_gpus, tmp_path):
    """Two machines (localhost, 127.0.0.1), each with its own nvidia-smi (a wrapper picking a
    state file): one shows fewer GPUs than tfcluster_gpu_count, their drivers differ."""
    other = FakeGpus(tmp_path / "other.json", count=1)
    other.state["driver"] = "535.183.01"
    other.save()
    wrapper = tmp_path / "other-smi"
    wrapper.write_text('#!/bin/sh\nFAKE_NVIDIA_SMI_STATE=%s exec %s "$@"\n' % (other.path,
                                                                             FAKE_SMI))
    wrapper.chmod(0o755)
    inv = inventory(tmp_path, workers=2, slot_vars={
        1: "tfcluster_nvidia_smi: %s, tfcluster_gpu_count: 2" % wrapper})
    with open(inv) as handle:
        text = handle.read().replace("worker1: {ansible_host: localhost", "worker1: {ansible_host: "
                                     "127.0.0.1")
    with open(inv, "w") as handle:
        handle.write(text)
    try:
        proc = tfcluster("check", "-i", inv)
    finally:
        other.close()
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "tfcluster: warning: NVIDIA driver versions differ (localhost=550.54.15, " \
        "127.0.0.1=535.183.01)" in proc.stdout + proc.stderr
    assert proc.stderr.strip().endswith(
        "127.0.0.1: nvidia-smi shows 1 GPU(s) but tfcluster_gpu_count says 2: check the host "
        "(nvidia-smi -L; a board may have fallen off the bus) or fix tfcluster_gpu_count"), \
        proc.stderr


@pytest.mark.slow
def test_three_launches_at_once_one_gets_the_free_gpus(fake_gpus, tmp_path):
    """Two healthy GPUs, three launches started together, each wanting every free GPU (one
    task per machine sees all of them): exactly one run gets them, the others are refused
    naming it (a run that loses the claim race places itself again and finds them claimed)."""
    fake_gpus.set(2, ecc=1)
    fake_gpus.set(3, remap_failure="Yes")
    marker = tmp_path / "go"
    hold = "echo gpus=$CUDA_VISIBLE_DEVICES; while [ ! -e %s ]; do sleep 0.1; done" % marker
    runs_dir = str(tmp_path / "runs")
    base = free_port_block()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir, "launch", "--cmd", hold,
         "-i", inventory(tmp_path, workers=1, name="r%d.yml" % i, port_base=base + i),
         "--plain", "--run-id", "r%d" % i], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for i in range(3)]
    try:
        def settled():  # one run holds both GPUs, the two others have ended
            held = {(gpuclaims.holder(u) or {}).get("run") for u in fake_gpus.uuids()[:2]}
            return len(held) == 1 and None not in held and \
                sum(p.poll() is not None for p in procs) == 2
        wait_for(settled, 120, "one run to hold the GPUs and the two others to end")
        marker.touch()
        results = [finish(p) for p in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert sorted(code for code, _, _ in results) == [0, 3, 3], results
    winner = "r%d" % [code for code, _, _ in results].index(0)
    assert "gpus=0,1" in results[int(winner[1])][1]
    for code, out, err in results:
        if code == 3:
            assert "no free GPU for worker:0: GPU 0 claimed by run %s" % winner in err, err
            assert "gpus=" not in out


def test_held_claims_are_touched_for_tmp_cleaners(fake_gpus):
    gpu_uuid = fake_gpus.uuids()[0]
    claims = gpuclaims.GpuClaims()
    assert claims.claim({gpu_uuid: ["worker-0"]}, "long")["taken"] == {}
    try:
        path = gpuclaims.claim_path(gpu_uuid)
        os.utime(path, (time.time() - 40 * 86400,) * 2)
        claims.touch(every=3600)  # not yet an hour
        assert os.stat(path).st_mtime < time.time() - 39 * 86400
        claims.touch(every=0)
        assert os.stat(path).st_mtime > time.time() - 3600
    finally:
        claims.release()


def test_a_claims_folder_another_run_is_still_making_is_waited_for(tmp_path, monkeypatch):
    """mkdir, then chmod: a second run that finds the folder in between waits for the sticky
    bit instead of calling it planted; a folder that never gets the bit is still refused."""
    import threading
    claims = tmp_path / "claims"
    monkeypatch.setattr(gpuclaims, "CLAIMS_DIR", str(claims))
    claims.mkdir(mode=0o700)
    later = threading.Timer(0.2, os.chmod, (claims, 0o1777))
    later.start()
    try:
        assert gpuclaims.shared_dir() == str(claims)
    finally:
        later.cancel()
    assert os.stat(claims).st_mode & stat.S_ISVTX
    plain = tmp_path / "plain"
    plain.mkdir(mode=0o700)
    monkeypatch.setattr(gpuclaims, "CLAIMS_DIR", str(plain))
    with pytest.raises(OSError, match="is not a sticky folder: remove it"):
        gpuclaims.shared_dir()
