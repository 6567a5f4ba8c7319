"""The trainers and tensorflow roles on local hosts (ansible-playbook, local connection): a dry
run on a host never deployed exits 0, reports the code it would install and names the command
that fills an empty wheelhouse; and the archive the trainers role packs on the controller is gone
afterwards, also when every host failed to unpack it."""
import pytest

from support.ansible_run import run_on_local_hosts, task_statuses

pytestmark = pytest.mark.slow


def role(name):
    return "    - name: Run %s\n      ansible.builtin.import_role:\n        name: %s\n" % (name, name)


def test_a_dry_run_on_a_fresh_host_reports_what_it_would_do_and_leaves_no_archive(tmp_path):
    (tmp_path / "tmp").mkdir()
    (tmp_path / "wheelhouse").mkdir()  # empty: `tfcluster wheelhouse` was not run
    fresh = tmp_path / "never-deployed"
    proc = run_on_local_hosts(tmp_path, {"fresh": "{tfcluster_root: %s}" % fresh},
                              role("tensorflow") + role("trainers"), "--check", "--diff",
                              env={"TMPDIR": str(tmp_path / "tmp")})
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert "run `tfcluster wheelhouse --dest %s` on the controller first" % (
        tmp_path / "wheelhouse") in " ".join(proc.stdout.split()), proc.stdout[-5000:]
    statuses = task_statuses(proc.stdout)
    assert statuses[("trainers : Report the trainer files a dry run would install on a fresh host",
                     "fresh")] == "changed", proc.stdout[-5000:]
    assert "files would be installed in %s" % fresh in proc.stdout
    assert not fresh.exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_the_archive_is_removed_when_every_host_fails_to_unpack_it(tmp_path):
    (tmp_path / "tmp").mkdir()
    hosts = {}
    for name in ("a", "b"):
        (tmp_path / name).write_text("a file where the code's folder should be\n")
        hosts[name] = "{tfcluster_root: %s}" % (tmp_path / name)
    proc = run_on_local_hosts(tmp_path, hosts, role("trainers"),
                              env={"TMPDIR": str(tmp_path / "tmp")})
    assert proc.returncode == 2, proc.stdout[-5000:] + proc.stderr[-2000:]
    statuses = task_statuses(proc.stdout)
    assert {statuses[("trainers : Ensure the trainer files are unpacked on the host", name)]
            for name in hosts} == {"fatal"}, proc.stdout[-5000:]
    assert list((tmp_path / "tmp").iterdir()) == [], "the archive was left on the controller"
