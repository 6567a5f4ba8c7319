"""What a person sees: the console reporters, the live table, the end-of-run summary, the metrics picture and TensorBoard."""
