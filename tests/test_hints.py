"""The failure hints: TensorFlow's real error texts map to one line of advice, once."""
from tfcluster.diagnosis.hints import hints_for, print_hints
from tfcluster.view.report import PlainReporter

# The end of a worker's log under Keras 3, as examples/keras_multi_worker.py printed it.
KERAS3_MWMS = """Traceback (most recent call last):
  File "/opt/tfcluster/examples/keras_multi_worker.py", line 54, in <module>
  File "/opt/tfcluster/venv/lib/python3.11/site-packages/keras/src/utils/traceback_utils.py", line 122, in error_handler
ValueError: Attempt to convert a value (PerReplica:{
  0: <tf.Tensor: shape=(64, 8, 8), dtype=float32>
}) with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.
"""
KERAS3_PSS = """  File "/v/lib/python3.11/site-packages/keras/src/utils/traceback_utils.py", line 122, in error_handler
ValueError: To use this dataset, you need to pass this dataset to ClusterCoordinator.create_per_worker_dataset.
"""


def test_keras3_failures_name_the_fix_once():
    hints = hints_for([KERAS3_MWMS, KERAS3_MWMS, KERAS3_PSS])
    assert len(hints) == 1 and "--env TF_USE_LEGACY_KERAS=1" in hints[0]


def test_the_same_error_outside_keras3_gives_no_keras_hint():
    # tf-keras's own files (tf_keras/src) or a custom loop: not Keras 3's model.fit.
    assert hints_for([KERAS3_MWMS.replace("/keras/src/", "/tf_keras/src/")]) == []
    assert hints_for([KERAS3_PSS.splitlines()[1]]) == []
    assert hints_for(["ValueError: something else"]) == []


def test_missing_tf_keras_is_named():
    hints = hints_for(["ModuleNotFoundError: No module named 'tf_keras'"])
    assert len(hints) == 1 and "tf-keras" in hints[0]


def test_a_step_refused_as_a_repeated_request_names_restarts():
    # worker:0's log when the ps refused its step (mnist_replica, TensorFlow 2.21, one of two
    # processes of the run the ps aborted).
    log = ("tensorflow.python.framework.errors_impl.CancelledError: Graph execution error:\n"
           "ABORTED: From /job:ps/replica:0/task:0:\n"
           "The same RunGraph (Worker) request was received twice. goo.gle/debugstr    "
           "graph_handle: \"0000000000000005\" step_id: 25205348973160265\n")
    hints = hints_for([log])
    assert len(hints) == 1 and "--restarts N" in hints[0] and "not the program" in hints[0]
    assert hints_for([log.replace("received twice", "received")]) == []


def test_print_hints_reads_the_logs_it_is_given(tmp_path, capsys):
    (tmp_path / "worker-0.log").write_text("x" * 300000 + KERAS3_MWMS)
    (tmp_path / "worker-1.log").write_text(KERAS3_MWMS)
    print_hints(PlainReporter(), str(tmp_path), ["worker-0.log", "worker-1.log", "missing.log"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfcluster: hint: ")
