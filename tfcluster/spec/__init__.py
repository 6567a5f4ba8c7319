"""The cluster model (TF_CONFIG, classic flags, the dist_test string) and the examples catalog."""
