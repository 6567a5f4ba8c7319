"""nvidia-smi as real drivers answer it, and what tfcluster makes of each answer.

The fake (tests/programs/nvidia-smi) answers from documented behaviour, each case cited there:
an unknown field, [N/A] and [Not Supported], a lost GPU, MIG, no GPU, no driver, a corrupted
infoROM, a slow answer. Here: the fake gives those answers; gpuinfo degrades loudly on each
(never a silent CPU run); `launch --wait` queues by count; a GPU's holder reads the same in
`tfcluster gpus` and in the preflight; every answer saved under tests/data/nvidia-smi/ replays to
the facts it gave; scripts/gpu-smoke passes its dry run. Real answers so far: one H100 (the
captured-* folders there); the rest is transcribed from documentation.
"""
import contextlib
import importlib.machinery
import importlib.util
import io
import json
import os
import subprocess
import sys
import time

import pytest

from support import REPO
from support.gpus import FAKE_SMI, local_slots, outcomes_of, reports_for
from support.procs import processes_matching
from tfcluster.gpus import placement as gpus
from tfcluster.gpus import table as gpustable
from tfcluster.hosts.inventory import Machine, Slot
from tfcluster.spec.cluster import build_cluster
from tfcluster_agent import gpuclaims, gpuinfo
from tfcluster.runs.record import PreflightReport

SAVED = os.path.join(REPO, "tests", "data", "nvidia-smi")


def fake_module():
    loader = importlib.machinery.SourceFileLoader("fake_nvidia_smi", FAKE_SMI)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def ask_fake(monkeypatch, state_path, *argv):
    """(exit code, stdout) of the fake, run in this process."""
    out = io.StringIO()
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", state_path)
    with contextlib.redirect_stdout(out):
        try:
            code = fake_module().main(list(argv))
        except SystemExit as exit:
            code = exit.code
    return code, out.getvalue()


def worker_cluster(count=1, **machine):
    return build_cluster(local_slots(count, **machine))


QUERY = "--format=csv,noheader,nounits"


def test_the_fake_answers_as_the_documentation_says(fake_gpus, monkeypatch):
    def state(**extra):
        fake_gpus.state.update(extra)
        fake_gpus.save()
        return fake_gpus.path

    uuid0 = fake_gpus.uuids()[0]
    fake_gpus.set(1, mig=["1g.10gb", "2g.20gb"])
    fake_gpus.set(2, ecc="[N/A]", retired_pending="[Not Supported]")
    code, out = ask_fake(monkeypatch, state(), "-L")
    assert code == 0 and out.splitlines()[:4] == [
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: %s)" % uuid0,
        "GPU 1: NVIDIA A100-SXM4-80GB (UUID: %s)" % fake_gpus.uuids()[1],
        "  MIG 1g.10gb     Device  0: (UUID: MIG-%s-0000)" % fake_gpus.uuids()[1][4:12],
        "  MIG 2g.20gb     Device  1: (UUID: MIG-%s-0001)" % fake_gpus.uuids()[1][4:12]]
    code, out = ask_fake(monkeypatch, state(), "--query-gpu=index,mig.mode.current,utilization.gpu,"
                         "ecc.errors.uncorrected.volatile.total,retired_pages.pending", QUERY)
    assert code == 0 and out.splitlines()[:3] == [
        "0, Disabled, 0, 0, No", "1, Enabled, [N/A], 0, No",
        "2, Disabled, 0, [N/A], [Not Supported]"]
    for field, unknown in (("retired_pages.pending", ["retired_pages.pending"]), ("no.such", [])):
        asked = "--query-gpu=index,%s" % field
        assert ask_fake(monkeypatch, state(unknown_fields=unknown), asked, QUERY) == (
            2, 'Field "%s" is not a valid field to query.\n\n' % field)
    fake_gpus.set(1, lost=True, mig=[])
    code, out = ask_fake(monkeypatch, state(unknown_fields=[]), "-L")
    assert code == 15 and out.splitlines()[1] == (
        "Unable to determine the device handle for GPU 0000:11:00.0: GPU is lost. Reboot the "
        "system to recover this GPU")
    fake_gpus.set(1, lost=False, inforom_corrupted=True)
    code, out = ask_fake(monkeypatch, state(), "-L")
    assert code == 14 and out.splitlines()[-1] == (
        "WARNING: infoROM is corrupted at gpu 0000:11:00.0")
    assert ask_fake(monkeypatch, state(no_devices=True), "-L") == (6, "No devices were found\n")
    code, out = ask_fake(monkeypatch, fake_gpus.path + ".none", "-L")
    assert code == 9 and out.startswith("NVIDIA-SMI has failed because it couldn't communicate")


def test_an_unknown_field_is_dropped_and_the_other_counters_still_checked(fake_gpus,
                                                                           smi_in_process):
    """The issue's host: -L lists the GPUs, --query-gpu refuses retired_pages.pending."""
    fake_gpus.state["unknown_fields"] = ["retired_pages.pending"]
    fake_gpus.set(1, ecc=2)
    cluster = worker_cluster(1)
    reports = reports_for(cluster)
    facts = reports[cluster.tasks[0].machine.key].gpu_facts
    assert [(g["index"], g["checked"], g["ecc_errors"], g["retired_pending"])
            for g in facts["gpus"]] == [(0, True, 0, None), (1, True, 2, None), (2, True, 0, None),
                                        (3, True, 0, None)]
    assert gpus.problems(cluster, reports) == []
    assert gpus.assign(cluster, reports).tasks[0].cuda_visible_devices == "0,2,3"
    assert gpus.warnings(cluster, reports) == [
        'localhost: nvidia-smi answers `Field "retired_pages.pending" is not a valid field to '
        'query.` (an older driver or board): its GPUs are checked without retired_pages.pending']


def test_fields_unknown_to_the_other_queries_are_dropped_too(fake_gpus, smi_in_process):
    fake_gpus.state["unknown_fields"] = ["remapped_rows.failure", "used_memory"]
    pid = fake_gpus.use(0)
    fake_gpus.set(1, remap_failure="Yes")
    facts = gpuinfo.host_gpus()
    assert facts["gpus"][0]["processes"][0]["pid"] == pid
    assert facts["gpus"][0]["processes"][0]["used_memory"] is None
    assert [g["remap_failed"] for g in facts["gpus"]] == [None] * 4  # pre-Ampere: not asked
    assert facts["warning"] == (
        'nvidia-smi answers `Field "used_memory" is not a valid field to query.` (an older '
        'driver or board): its GPUs are checked without used_memory')


def test_a_failing_query_still_hands_out_the_listed_gpus_loudly(fake_gpus, smi_in_process):
    fake_gpus.state["gpus"] = fake_gpus.state["gpus"][:2]
    fake_gpus.set(0, inforom_corrupted=True)
    cluster = worker_cluster(2)
    reports = reports_for(cluster)
    facts = reports[cluster.tasks[0].machine.key].gpu_facts
    assert facts["error"] is None
    assert [(g["index"], g["checked"], gpus.health_short(g)) for g in facts["gpus"]] == [
        (0, False, "unknown"), (1, False, "unknown")]
    assert gpus.problems(cluster, reports) == []
    assert [t.cuda_visible_devices for t in gpus.assign(cluster, reports).tasks] == ["0", "1"]
    assert gpus.preflight_cell(reports[cluster.tasks[0].machine.key]) == "2?"
    warning = "WARNING: infoROM is corrupted at gpu 0000:10:00.0"
    assert gpus.warnings(cluster, reports) == [
        "localhost: nvidia-smi -L failed (exit 14): %s; GPU occupancy and health unknown, its 2 "
        "GPU(s) from nvidia-smi -L are handed out unchecked: nvidia-smi --query-gpu failed "
        "(exit 14): %s" % (warning, warning)]


def test_rows_of_an_unexpected_shape_leave_the_listed_gpus_unchecked(fake_gpus, smi_in_process,
                                                                     monkeypatch):
    fake_run = gpuinfo.run_smi

    def with_odd_row(argv, timeout):
        answer = fake_run(argv, timeout)
        if argv[1].startswith("--query-gpu"):
            return answer._replace(out=answer.out + "4, GPU-extra, 12 MiB\n")
        return answer

    monkeypatch.setattr(gpuinfo, "run_smi", with_odd_row)
    facts = gpuinfo.host_gpus()
    assert [g["checked"] for g in facts["gpus"]] == [False] * 4 and facts["error"] is None
    assert facts["warning"] == (
        "GPU occupancy and health unknown, its 4 GPU(s) from nvidia-smi -L are handed out "
        "unchecked: nvidia-smi --query-gpu answered a row of an unexpected shape: "
        "'4, GPU-extra, 12 MiB'")


def test_a_hung_nvidia_smi_is_bounded_and_reported(fake_gpus, tmp_path):
    fake_gpus.state["delay"] = 120
    fake_gpus.save()
    started = time.monotonic()
    facts = gpuinfo.host_gpus(deadline=1)
    assert time.monotonic() - started < 10
    assert facts["gpus"] == [] and facts["error"] == (
        "nvidia-smi -L did not answer within 1s (a stuck driver? `dmesg` shows its Xid errors)")
    assert not processes_matching(str(tmp_path / "bin")), "the hung nvidia-smi was left running"
    cluster = worker_cluster(1)
    problem, = gpus.problems(cluster, {cluster.tasks[0].machine.key: PreflightReport(
        python_ok=True, gpu_facts=facts)})
    assert problem.startswith("localhost: nvidia-smi -L did not answer within 1s") and \
        not problem.waitable


def test_a_query_that_hangs_after_the_listing_is_reported_and_ends_the_calls(fake_gpus,
                                                                             smi_in_process,
                                                                             monkeypatch):
    fake_run, asked = gpuinfo.run_smi, []

    def hangs_on_queries(argv, timeout):
        asked.append(argv[1].split("=")[0])
        return gpuinfo.Answer(None, "", "") if argv[1] != "-L" else fake_run(argv, timeout)

    monkeypatch.setattr(gpuinfo, "run_smi", hangs_on_queries)
    facts = gpuinfo.host_gpus()
    assert asked == ["-L", "--query-gpu"]  # the others would hang the same way
    assert [g["checked"] for g in facts["gpus"]] == [False] * 4
    assert facts["warning"] == (
        "GPU occupancy and health unknown, its 4 GPU(s) from nvidia-smi -L are handed out "
        "unchecked: nvidia-smi --query-gpu did not answer within 20s (a stuck driver? `dmesg` "
        "shows its Xid errors)")


@pytest.mark.parametrize("case", ["no devices", "lost GPU", "no driver"])
def test_nvidia_smi_without_a_usable_gpu_is_an_error_naming_the_host(case, fake_gpus,
                                                                      smi_in_process, monkeypatch):
    error = {
        "no devices": "nvidia-smi -L failed (exit 6): No devices were found",
        "lost GPU": "nvidia-smi -L: Unable to determine the device handle for GPU 0000:11:00.0: "
                    "GPU is lost. Reboot the system to recover this GPU",
        "no driver": "nvidia-smi -L failed (exit 9): NVIDIA-SMI has failed because it couldn't "
                     "communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
                     "driver is installed and running."}[case]
    if case == "no devices":
        fake_gpus.state["no_devices"] = True
        fake_gpus.save()
    elif case == "lost GPU":
        fake_gpus.set(1, lost=True)
    else:
        monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", "/nonexistent")
    cluster = worker_cluster(2)
    reports = reports_for(cluster)
    problem, = gpus.problems(cluster, reports)
    assert problem == (
        "localhost: %s: its GPUs cannot be used and its tasks would run on CPU: check the GPUs "
        "and the driver on the host (a lost GPU needs a reboot), or set tfcluster_gpu_count: 0 "
        "to run them on CPU knowingly" % error) and not problem.waitable
    # A CPU run on such a host, said knowingly; and a host running only a ps needs no GPU.
    for other in (worker_cluster(2, gpu_count=0), build_cluster([Slot(
            "ps0", "ps", Machine(address="localhost", connection="local"), port_base=24000)])):
        assert gpus.problems(other, reports_for(other)) == []
    table, _ = gpustable.rows([cluster.tasks[0].machine], outcomes_of({
        cluster.tasks[0].machine.key: gpuinfo.host_gpus()}))
    assert table == [("localhost", "-", "ERROR: " + error, "", "", "", "")]
    assert gpus.preflight_cell(reports[cluster.tasks[0].machine.key]) == "error"


def test_an_agent_not_yet_synced_keeps_its_meaning():
    """Before "absent", an agent said "error" for a host without nvidia-smi too."""
    cluster = worker_cluster(1)
    old = PreflightReport(python_ok=True, gpu_facts={"driver": None, "gpus": [],
                                                    "error": "nvidia-smi did not answer"})
    assert gpus.problems(cluster, {cluster.tasks[0].machine.key: old}) == []
    assert gpus.preflight_cell(old) == "0"
    machine = cluster.tasks[0].machine
    assert gpustable.rows([machine], outcomes_of({machine.key: old.gpu_facts})) == (
        [("localhost", "-", "no GPU (nvidia-smi did not answer)", "", "", "", "")], [])


def test_without_nvidia_smi_a_host_simply_has_no_gpu(smi_in_process):
    cluster = worker_cluster(1, nvidia_smi="/nonexistent/nvidia-smi")
    facts = gpuinfo.host_gpus("/nonexistent/nvidia-smi")
    reports = {cluster.tasks[0].machine.key: PreflightReport(python_ok=True, gpu_facts=facts)}
    assert gpus.problems(cluster, reports) == [] and gpus.warnings(cluster, reports) == []
    assert gpus.assign(cluster, reports).tasks[0].cuda_visible_devices == ""


def test_mig_mode_is_reported_and_its_gpus_not_handed_out(fake_gpus, smi_in_process):
    fake_gpus.set(1, mig=["1g.10gb", "1g.10gb"])
    fake_gpus.set(2, mig_mode="Enabled")  # MIG on, no instance made yet
    cluster = worker_cluster(2)
    reports = reports_for(cluster)
    facts = reports[cluster.tasks[0].machine.key].gpu_facts["gpus"]
    assert [gpus.health_short(g) for g in facts] == [
        "ok", "MIG mode (2 MIG device(s))", "MIG mode (mig.mode.current: Enabled)", "ok"]
    assert gpus.problems(cluster, reports) == []
    assert [t.cuda_visible_devices for t in gpus.assign(cluster, reports).tasks] == ["0", "3"]
    listed = build_cluster(local_slots(1, {0: (1,)}))
    problem, = gpus.problems(listed, reports_for(listed))
    assert problem == (
        "localhost: GPU 1 (tfcluster_gpus of worker0) is in MIG mode (2 MIG device(s)), whose "
        "devices tfcluster does not hand out as whole GPUs: disable MIG mode (`nvidia-smi -i 1 "
        "-mig 0` as root, then reset the GPU) or list another GPU in tfcluster_gpus")
    assert not problem.waitable


def claimed_by_another_run(uuids):
    claims = gpuclaims.GpuClaims()
    assert claims.claim({u: ["worker-%d" % i] for i, u in enumerate(uuids)}, "other") == {
        "taken": {}, "ahead": []}
    return claims


def test_wait_queues_by_count_and_the_hint_fits_the_case(fake_gpus, smi_in_process):
    """The issue's host: GPU 0 busy, 1 and 2 another run's, 3 failing. Waiting makes sense (1
    and 2 come free): unhealthy GPUs are left out of the count, not a reason to refuse."""
    pid = fake_gpus.use(0)
    fake_gpus.set(3, ecc=1)
    claims = claimed_by_another_run(fake_gpus.uuids()[1:3])
    user = gpuclaims.user_name()
    try:
        cluster = worker_cluster(1)
        problem, = gpus.problems(cluster, reports_for(cluster))
        assert problem == (
            "localhost: no free GPU for worker:0: GPU 0 busy, used by pid {pid} (user {user}: "
            "sleep 600), 10240 MiB; GPU 1 claimed by run other (user {user}, task worker-0); "
            "GPU 2 claimed by run other (user {user}, task worker-1); GPU 3 unhealthy: 1 "
            "uncorrectable ECC error(s) (ecc.errors.uncorrected.volatile.total): wait for one "
            "(`tfcluster launch --wait`), or share a busy one knowingly (--share-busy-gpus or "
            "tfcluster_gpu_share: true)".format(pid=pid, user=user)) and problem.waitable
        fake_gpus.set(0, mig=["7g.80gb"])  # claims alone: waiting is the one way
        problem, = gpus.problems(cluster, reports_for(cluster))
        assert problem.waitable and problem.endswith(
            "GPU 3 unhealthy: 1 uncorrectable ECC error(s) (ecc.errors.uncorrected.volatile."
            "total): wait for one (`tfcluster launch --wait`)")
    finally:
        claims.release()
    fake_gpus.set(1, remap_failure="Yes")
    fake_gpus.set(2, retired_pending="Yes")
    problem, = gpus.problems(cluster, reports_for(cluster))
    assert not problem.waitable and problem.endswith(
        ": none frees itself: replace or repair the failing board(s), disable MIG mode "
        "(`nvidia-smi -i 0 -mig 0` as root, then reset the GPU), or run elsewhere")


def test_a_holder_reads_the_same_in_the_table_and_the_preflight(fake_gpus, smi_in_process):
    fake_gpus.use(1, mib=2048)
    fake_gpus.set(2, memory_used=900)
    claims = claimed_by_another_run(fake_gpus.uuids()[:1])
    try:
        cluster = build_cluster(local_slots(3, {0: (0,), 1: (1,), 2: (2,)}))
        reports = reports_for(cluster)
        lines = gpus.problems(cluster, reports)
        machine = cluster.tasks[0].machine
        table, _ = gpustable.rows([machine], outcomes_of({
            machine.key: reports[machine.key].gpu_facts}))
    finally:
        claims.release()
    holders = [row[-1] for row in table]
    assert holders[3] == "free" and holders[2] == (
        "a process nvidia-smi does not show, 900 MiB (over tfcluster_gpu_busy_mib, 300)")
    assert len(lines) == 3
    for line, held in zip(lines, holders):
        assert ("is claimed by %s: " % held) in line or ("is busy, used by %s: " % held) in line


def replay(folder, monkeypatch):
    """The facts gpuinfo makes of the answers saved in FOLDER, each call answered from there."""
    with open(os.path.join(folder, "transcript.json")) as handle:
        transcript = json.load(handle)

    def saved(name):
        if name is None:
            return ""
        with open(os.path.join(folder, name)) as handle:
            return handle.read()

    def answer(argv, timeout):
        for call in transcript["calls"]:
            if call["argv"] == argv[1:]:
                return gpuinfo.Answer(call["exit"], saved(call["stdout"]), saved(call["stderr"]))
        raise AssertionError("%s has no answer to nvidia-smi %s: tfcluster asks what it did not "
                             "then; run scripts/gpu-smoke on a GPU machine again" % (
                                 folder, " ".join(argv[1:])))

    monkeypatch.setattr(gpuinfo, "run_smi", answer)
    monkeypatch.setattr(gpuclaims, "holder", lambda uuid: None)  # no claim files of theirs here
    return transcript, gpuinfo.host_gpus("nvidia-smi")


def check_replay(folder, monkeypatch):
    transcript, facts = replay(folder, monkeypatch)
    expect = transcript["expect"]
    assert (facts["error"] is None, facts["warning"] is None) == (
        expect["error"] is None, expect["warning"] is None), (folder, facts)
    assert [{k: g[k] for k in gpuinfo.SMI_FACTS} for g in facts["gpus"]] == expect["gpus"], folder
    return transcript, facts


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(SAVED)
                                        if os.path.isdir(os.path.join(SAVED, n))))
def test_saved_answers_replay_to_the_facts_they_gave(name, monkeypatch):
    transcript, facts = check_replay(os.path.join(SAVED, name), monkeypatch)
    if not transcript["source"].startswith("captured by scripts/gpu-smoke"):
        assert transcript["source"].startswith("TRANSCRIBED FROM DOCUMENTATION, NOT CAPTURED")
        assert (facts["error"], facts["warning"]) == (transcript["expect"]["error"],
                                                      transcript["expect"]["warning"])


@pytest.mark.slow
def test_gpu_smoke_passes_its_dry_run(tmp_path, monkeypatch):
    captures = tmp_path / "captures"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu-smoke"),
                           "--dry-run", "--capture-to", str(captures)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "gpu-smoke: all steps passed (dry run: no GPU was used)"
    assert sum(line.startswith("gpu-smoke: ok: ") for line in proc.stdout.splitlines()) == 6
    saved = sorted(os.listdir(captures))
    assert [name.rsplit("-", 1)[1] for name in saved] == ["busy", "idle"]
    for name in saved:
        with monkeypatch.context() as patched:
            _, facts = check_replay(str(captures / name), patched)
        assert len(facts["gpus"]) == 2
    _, busy = replay(str(captures / saved[0]), monkeypatch)
    assert [len(g["processes"]) for g in busy["gpus"]] == [1, 0]  # the holder, pid gone now
