"""Checkpoints that are never half-written (trainers/common/checkpoints.py): the commit every
trainer saves through and the resume that takes only a complete checkpoint. Plain files stand in
for TensorFlow's: the commit does not read what it hashes, so no test here imports TensorFlow."""
import os
import random
import subprocess
import sys

from support.checkpoints import FILES, content, write_step
from trainers.common import checkpoints

TESTS = os.path.dirname(os.path.abspath(__file__))

# The writer: resumes, then saves one step after the other until it is killed. It imports
# support.checkpoints (not conftest: pytest would cost each of the 30 starts a tenth of a second).
WRITER = r"""
import sys
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from support.checkpoints import write_step
from trainers.common import checkpoints
directory = sys.argv[1]
found = checkpoints.latest(directory)
step = found.step if found else 0
print("ready", step, flush=True)
while True:
    step += 1
    checkpoints.commit(directory, step, lambda folder: write_step(folder, step))
    print("committed", step, flush=True)
"""


def assert_whole(found):
    """FOUND's files are exactly those of its step's save."""
    assert found.entry == os.path.join(found.folder, "model.ckpt")
    for name in FILES:
        with open(os.path.join(found.folder, name), "rb") as handle:
            assert handle.read() == content(name, found.step), (found, name)


def commit(directory, step):
    return checkpoints.commit(str(directory), step, lambda folder: write_step(folder, step))


def test_a_commit_is_found_whole_and_only_the_newest_two_are_kept(tmp_path):
    assert checkpoints.latest(str(tmp_path / "none")) is None
    for step in (10, 20, 30):
        made = commit(tmp_path, step)
    assert made.folder == str(tmp_path / "ckpt-000000030")
    found = checkpoints.latest(str(tmp_path))
    assert found.step == 30
    assert_whole(found)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000020", "ckpt-000000030"]
    # The same step saved again replaces it, whole.
    commit(tmp_path, 30)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000020", "ckpt-000000030"]
    assert_whole(checkpoints.latest(str(tmp_path)))


def test_a_resume_passes_over_a_checkpoint_that_does_not_verify(tmp_path):
    """Cut, altered or without its manifest: the newest is named and passed over, the one
    before it is taken."""
    def spoil_truncated(folder):
        with open(os.path.join(folder, "model.ckpt.data-00000-of-00001"), "r+b") as handle:
            handle.truncate(100)

    def spoil_altered(folder):
        with open(os.path.join(folder, "extra", "vocab.txt"), "r+b") as handle:
            handle.write(b"X")

    def spoil_manifest(folder):
        os.remove(os.path.join(folder, checkpoints.MANIFEST))

    def spoil_file(folder):
        os.remove(os.path.join(folder, "model.ckpt.index"))

    for spoil, why in ((spoil_truncated, "has 100 bytes"), (spoil_altered, "does not match"),
                       (spoil_manifest, "no MANIFEST.json"), (spoil_file, "index missing")):
        directory = tmp_path / spoil.__name__
        commit(directory, 1)
        spoil(commit(directory, 2).folder)
        said = []
        found = checkpoints.latest(str(directory), said.append)
        assert found.step == 1, spoil.__name__
        assert_whole(found)
        assert len(said) == 1 and "ckpt-000000002" in said[0] and why in said[0], said


def test_a_save_cut_off_leaves_nothing_a_resume_reads_and_the_next_commit_clears_it(tmp_path):
    def write_then_fail(folder):
        write_step(folder, 2)
        raise OSError("disk full")

    commit(tmp_path, 1)
    try:
        checkpoints.commit(str(tmp_path), 2, write_then_fail)
    except OSError:
        pass
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000001"]  # a failed save cleans up
    # A save killed in the middle leaves its partial folder: never read, cleared later.
    os.makedirs(tmp_path / ".partial-3-x")
    write_step(str(tmp_path / ".partial-3-x"), 3)
    assert checkpoints.latest(str(tmp_path)).step == 1
    commit(tmp_path, 4)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000001", "ckpt-000000004"]


def test_saves_killed_at_random_points_never_lead_to_a_resume_from_a_partial_checkpoint(
        tmp_path):
    """30 times: a process saving checkpoints one after the other is killed with SIGKILL at a
    random moment; the resume then finds a whole checkpoint, at least as new as the last save
    the writer finished, and the next writer goes on from it."""
    from support.procs import wait_for
    rng = random.Random(41)
    directory = str(tmp_path / "checkpoints")
    cut_off, last_committed = 0, 0
    for _ in range(30):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, directory, TESTS, os.path.dirname(TESTS)],
            stdout=subprocess.PIPE, text=True)
        try:
            ready = writer.stdout.readline().split()
            assert ready[0] == "ready" and int(ready[1]) >= last_committed, ready
            wait_for(lambda: saving(directory, int(ready[1])), 30, "the writer's first save",
                     interval=0.005)
            # The kill falls anywhere within its next few saves.
            try:
                writer.wait(timeout=rng.uniform(0, 0.15))
            except subprocess.TimeoutExpired:
                pass
            writer.kill()
            writer.wait()
            said = writer.stdout.read().split("\n")
        finally:
            writer.kill()
            writer.stdout.close()
        committed = [int(line.split()[1]) for line in said if line.startswith("committed")]
        if committed:
            last_committed = committed[-1]
        if any(n.startswith(checkpoints.PARTIAL) for n in os.listdir(directory)):
            cut_off += 1
        found = checkpoints.latest(directory)
        if found is None:  # killed before its first save was whole: nothing to resume from
            assert last_committed == 0, last_committed
            continue
        assert found.step >= last_committed, (found, last_committed)
        assert_whole(found)
        last_committed = found.step
    # Most kills fell inside a save (its files half-written, hashed or renamed): the test saw
    # partial checkpoints, and the resume never took one.
    assert cut_off >= 10, "only %d of 30 kills cut a save off" % cut_off


def saving(directory, after):
    """True once DIRECTORY holds a save under way or one newer than step AFTER."""
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return any(n.startswith(checkpoints.PARTIAL) or
               (n.startswith(checkpoints.COMPLETE) and int(n[len(checkpoints.COMPLETE):]) > after)
               for n in names)
