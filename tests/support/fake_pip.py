"""A fake pip for `tfcluster wheelhouse` (given with --pip): it counts its calls in a file
`calls` beside it, fails while a file `fail` is there, and writes placeholder wheels."""

FAKE_PIP = r'''
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls"), "a") as handle:
    handle.write(" ".join(sys.argv[1:]) + "\n")
if os.path.exists(os.path.join(here, "fail")):
    sys.exit(1)
dest = sys.argv[sys.argv.index("--dest") + 1]
names = ["tf_keras-2.21.0-py3-none-any.whl"] if "--no-deps" in sys.argv else [
    "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl", "six-1.17.0-py2.py3-none-any.whl"]
for name in names:
    if not os.path.exists(os.path.join(dest, name)):
        with open(os.path.join(dest, name), "w") as handle:
            handle.write("wheel " + name)
'''
