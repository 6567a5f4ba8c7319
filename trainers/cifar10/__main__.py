"""python -m trainers.cifar10: the CIFAR-10 program's command line."""
from trainers.cifar10 import main
from trainers.common import bootstrap

raise SystemExit(bootstrap.main_guard(main))
