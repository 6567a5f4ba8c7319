"""A stand-in task for stall detection and stacks, without TensorFlow.

ps tasks are fake_task.py's (they listen on their port until stopped). Workers do what
STALL_<JOB>_<INDEX> says: "work" prints a line every half second, "spin" computes without
printing, "block" prints one line and then waits for data that never comes (a stall). The
default is work.
"""
import json
import os
import runpy
import time

config = json.loads(os.environ["TF_CONFIG"])
job, index = config["task"]["type"], config["task"]["index"]


def wait_for_data():
    while True:
        time.sleep(3600)


def spin():
    total = 0
    while True:
        total += sum(range(10000))


def work():
    step = 0
    while True:
        step += 1
        print("step %d" % step, flush=True)
        time.sleep(0.5)


if job == "ps":
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_task.py"),
                   run_name="__main__")
behaviour = os.environ.get("STALL_%s_%d" % (job.upper(), index), "work")
print("%s:%d %s" % (job, index, behaviour), flush=True)
{"work": work, "spin": spin, "block": wait_for_data}[behaviour]()
