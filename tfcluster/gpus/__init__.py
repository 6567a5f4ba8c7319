"""GPUs: which task sees which GPU, the claims shared by users of one server, and the GPU table."""
