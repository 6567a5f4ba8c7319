"""python -m trainers.cifar10: the CIFAR-10 program's command line. Local mode makes its
devices first, then turns graph mode on itself."""
from trainers.cifar10 import build_parser, find_cluster, run
from trainers.common import bootstrap

bootstrap.entry(build_parser, run, find_cluster=find_cluster,
                graph=lambda args: args.mode != "local")
