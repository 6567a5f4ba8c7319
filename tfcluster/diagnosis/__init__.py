"""Why a run hangs, fails or lags: stalls and their stacks, causes, the root cause, stragglers and hints."""
