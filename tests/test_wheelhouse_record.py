"""`tfcluster wheelhouse`'s download record (tfcluster/deploy/wheelrecord.py): a rerun with the same
inputs and every recorded wheel in place runs no pip; anything else runs it. A fake pip (a small
Python program given with --pip) counts its calls and writes wheels; no network, no real pip."""
import argparse
import json
import os
import shutil
import sys

import pytest

from support import REPO
from support.fake_pip import FAKE_PIP
from tfcluster.deploy import wheelhouse
from tfcluster.deploy import wheelrecord
from tfcluster.errors import CommandFailed


class Wheelhouse:
    """A DEST, a copy of the constraints file and the fake pip, in tmp_path."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.dest = tmp_path / "wheelhouse"
        self.constraints = tmp_path / "constraints.txt"
        shutil.copy(os.path.join(REPO, "roles", "tensorflow", "files", "constraints.txt"),
                    self.constraints)
        self.pip = tmp_path / "pip"
        self.pip.mkdir()
        (self.pip / "fake_pip.py").write_text(FAKE_PIP)

    def run(self, *extra):
        parser = wheelhouse.add_arguments(argparse.ArgumentParser())
        return wheelhouse.run(parser.parse_args(
            ["--dest", str(self.dest), "--constraints", str(self.constraints), "--no-pack",
             "--pip", "%s %s" % (sys.executable, self.pip / "fake_pip.py"), *extra]))

    def calls(self):
        calls = self.pip / "calls"
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    def record(self):
        with open(self.dest / wheelrecord.RECORD) as handle:
            return json.load(handle)


@pytest.fixture
def house(tmp_path):
    return Wheelhouse(tmp_path)


def test_a_rerun_with_the_same_inputs_runs_no_pip(house, capsys):
    assert house.run() == 0
    assert house.calls() == 2  # the download and the --no-deps one
    assert sorted(house.record()["wheels"]) == sorted(
        p.name for p in house.dest.iterdir() if p.name.endswith(".whl"))
    capsys.readouterr()
    assert house.run() == 0
    assert house.calls() == 2
    assert "3 wheels, 0 MB in %s are up to date (pip not run)" % house.dest in capsys.readouterr().out


def test_the_pack_still_follows_a_download_skipped(house, capsys):
    assert house.run() == 0
    parser = wheelhouse.add_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--dest", str(house.dest), "--constraints", str(house.constraints),
                              "--pip", "%s %s" % (sys.executable, house.pip / "fake_pip.py"),
                              "--pack-python", str(house.tmp / "no-python")])
    capsys.readouterr()
    assert wheelhouse.run(args) == 0
    out = capsys.readouterr().out
    assert house.calls() == 2
    assert "up to date (pip not run)" in out and "does not run here" in out, out


def change_constraints(house):
    with open(house.constraints, "a") as handle:
        handle.write("zipp==3.23.0\n")  # a `--lock` that pinned one package more


def delete_a_wheel(house):
    os.remove(house.dest / "six-1.17.0-py2.py3-none-any.whl")


def resize_a_wheel(house):
    with open(house.dest / "six-1.17.0-py2.py3-none-any.whl", "a") as handle:
        handle.write("more")


def lose_the_record(house):
    os.remove(house.dest / wheelrecord.RECORD)


@pytest.mark.parametrize("change", [change_constraints, delete_a_wheel, resize_a_wheel,
                                    lose_the_record])
def test_a_changed_input_or_wheel_runs_pip_again(house, change):
    assert house.run() == 0
    change(house)
    assert house.run() == 0
    assert house.calls() == 4
    # Recorded again: the next rerun runs none.
    assert house.run() == 0
    assert house.calls() == 4
    assert (house.dest / "six-1.17.0-py2.py3-none-any.whl").exists()


def test_another_option_runs_pip_again(house):
    assert house.run() == 0
    assert house.run("--gpu") == 0
    assert house.calls() == 4
    assert house.record()["inputs"]["gpu"] is True


def test_a_failed_pip_leaves_no_record(house):
    assert house.run() == 0
    change_constraints(house)
    (house.pip / "fail").write_text("")
    with pytest.raises(CommandFailed, match=r"^pip download failed \(exit code 1\)$") as failed:
        house.run()
    assert failed.value.exit_code == 1
    assert house.calls() == 3  # stopped at the first download
    assert not (house.dest / wheelrecord.RECORD).exists()
    # The same inputs as the first run: the failed download came between, so pip runs.
    house.constraints.write_text(house.constraints.read_text().replace("zipp==3.23.0\n", ""))
    os.remove(house.pip / "fail")
    assert house.run() == 0
    assert house.calls() == 5


def test_the_record_holds_no_pip_setting_in_clear(house, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "https://user:s3cret-token@index.example/simple")
    config = house.tmp / "pip.conf"
    config.write_text("[global]\nextra-index-url = https://extra.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    assert house.run() == 0
    text = (house.dest / wheelrecord.RECORD).read_text()
    assert "s3cret-token" not in text and "index.example" not in text
    assert "extra.example" not in text
    # Another index, in the environment or in pip.conf: pip runs.
    monkeypatch.setenv("PIP_INDEX_URL", "https://user:s3cret-token@other.example/simple")
    assert house.run() == 0
    assert house.calls() == 4
    config.write_text("[global]\nextra-index-url = https://more.example/simple\n")
    assert house.run() == 0
    assert house.calls() == 6
