"""tfcluster_agent/values.py: value classes as the dataclasses they replace behaved, and no
`dataclasses` import where a launch goes (the controller's modules, the agent's start)."""
import pickle
import subprocess
import sys

import pytest

from support import REPO
from tfcluster_agent.values import as_dict, field, fields, replace, value_class


@value_class(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: list = field(default_factory=list, compare=False)
    note: str = field(default="", repr=False)


@value_class
class Counter:
    count: int = 0


def test_fields_defaults_equality_hash_and_repr():
    p = Point(1, tags=["a"])
    assert (p.x, p.y, p.tags, p.note) == (1, 0, ["a"], "")
    assert Point(1).tags is not Point(1).tags  # a fresh default per value
    assert p == Point(1, 0, ["b"]) and p != Point(2) and p != (1, 0)  # tags: not compared
    assert hash(p) == hash(Point(1)) and {p, Point(1)} == {p}
    assert repr(p) == "Point(x=1, y=0, tags=['a'])"
    assert [f.name for f in fields(Point)] == ["x", "y", "tags", "note"] == list(Point.field_names)
    assert as_dict(p) == {"x": 1, "y": 0, "tags": ["a"], "note": ""}
    assert replace(p, y=5) == Point(1, 5) and p.y == 0


def test_frozen_refuses_assignment_and_the_others_allow_it_but_no_hash():
    with pytest.raises(AttributeError, match="frozen Point"):
        Point(1).x = 2
    counter = Counter()
    counter.count += 1
    assert counter == Counter(1)
    with pytest.raises(TypeError):
        hash(counter)


def test_bad_construction_and_pickling():
    with pytest.raises(TypeError, match="missing field 'x'"):
        Point()
    with pytest.raises(TypeError, match="unexpected or repeated field 'z'"):
        Point(1, z=2)
    with pytest.raises(TypeError, match="takes 4 fields, got 5"):
        Point(1, 2, [], "", 5)
    with pytest.raises(TypeError):
        replace(Point(1), z=3)
    assert pickle.loads(pickle.dumps(Point(3, tags=[1]))) == Point(3)  # the inventory's cache


def test_a_launch_imports_no_dataclasses():
    code = ("import sys\nimport tfcluster.cli.main, tfcluster.launch.launcher, tfcluster.view.console\n"
            "import tfcluster_agent.agent, tfcluster_agent.taskspec\n"
            "print(sorted(m for m in ('dataclasses', 'inspect') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
