from tfcluster.cli import run

run()
