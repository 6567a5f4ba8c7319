from tfcluster.cli.main import run

run()
