"""The tasks a watch marks in the live view (a straggler, the slowest worker) and for how long."""


class MarkedTasks:
    """MARKED {label: since} holds the marks on now; NAMED {label: {"since": its first mark,
    "seconds": the time of its ended marks, ...}} every task ever marked, for the summary. A
    subclass says how a mark ends: UNMARKED(label), the console's line, and ROW, the reporter's
    method that marks a task's row (task, on)."""
    UNMARKED = None
    ROW = ""

    def __init__(self, reporter):
        self.reporter = reporter
        self.running = {}  # label -> task, while it runs
        self.marked = {}
        self.named = {}

    def _mark_on(self, label, since, **first):
        """Mark LABEL from SINCE; its NAMED entry (FIRST: the entry's other keys at its first
        mark)."""
        self.marked[label] = since
        return self.named.setdefault(label, dict(since=since, seconds=0.0, **first))

    def _unmark(self, label, now, quiet=False):
        since = self.marked.pop(label, None)
        if since is None:
            return
        self.named[label]["seconds"] += now - since
        if not quiet:
            self.reporter.note(type(self).UNMARKED(label))
            getattr(self.reporter, self.ROW)(self.running[label], False)

    def marked_seconds(self, label, now):
        """How long LABEL has been marked, its mark now included."""
        return self.named[label]["seconds"] + (now - self.marked[label]
                                               if label in self.marked else 0.0)
