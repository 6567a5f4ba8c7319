"""Run records on the controller: run.json, run folders and the metrics store."""
