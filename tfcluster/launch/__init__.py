"""A launch from plan to teardown: which task runs where, preflight, the task environment, following the run, and stopping it."""
