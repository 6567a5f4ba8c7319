"""What the example trainers share: the cluster, flags and entry point (bootstrap), servers and
sessions, the training loop, models and data loaders. Host side: never imports tfcluster."""
