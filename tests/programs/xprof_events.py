"""What TensorBoard's profile plugin shows of trace files: its own converter (xprof's
XSpaceToToolsData, the C library tensorboard-plugin-profile serves the Trace Viewer from) turns
each file into the Trace Viewer's JSON, and this prints {file: {event name: count}} as JSON.

  PYTHON xprof_events.py CONVERT_MODULE TRACE.xplane.pb ...

CONVERT_MODULE is xprof's convert/_pywrap_profiler_plugin.py (ctypes and the standard library
only), loaded alone: the xprof package itself would import its web server's dependencies.
"""
import collections
import importlib.util
import json
import sys


def converter(path):
    spec = importlib.util.spec_from_file_location("xprof_profiler_plugin", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(argv):
    plugin = converter(argv[0])
    found = {}
    for trace in argv[1:]:
        data, ok = plugin.xspace_to_tools_data([trace], "trace_viewer@", {})
        if not ok:
            found[trace] = None
            continue
        events = json.loads(data).get("traceEvents", [])
        found[trace] = dict(collections.Counter(e.get("name") for e in events if "name" in e))
    print(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1:])
