try:
    from tfcluster.cli.main import run
except KeyboardInterrupt:  # Ctrl-C while the program loads: no traceback
    raise SystemExit(130) from None

run()
