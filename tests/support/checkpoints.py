"""Checkpoint saves in plain files that stand in for TensorFlow's. The writer processes of
tests/test_checkpoints.py import it too: stdlib only."""
import os

# A save as a trainer makes one: files of several sizes, written in chunks, whose bytes say
# which step they belong to (so a test can tell a whole checkpoint from a mixed or cut one).
FILES = {"model.ckpt.index": 3, "model.ckpt.data-00000-of-00001": 48, "extra/vocab.txt": 1}
CHUNK = 16 << 10


def content(name, step):
    """The bytes of file NAME in the save of STEP."""
    line = ("%s step %d\n" % (name, step)).encode()
    size = FILES[name] * CHUNK
    return (line * (size // len(line) + 1))[:size]


def write_step(folder, step):
    """WRITE for commit(): every file of FILES, chunk by chunk; returns the entry."""
    for name in FILES:
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = content(name, step)
        with open(path, "wb") as handle:
            for start in range(0, len(data), CHUNK):
                handle.write(data[start:start + CHUNK])
                handle.flush()
    return os.path.join(folder, "model.ckpt")
