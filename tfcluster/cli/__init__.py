"""The command line: the parser, its value types, and the commands (launch, init, status, logs, stop, runs...)."""
