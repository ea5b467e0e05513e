"""The nightly retrain's own rules: the data pool that grows night by night (`pool`) and the promotion gate
(`promotion`)."""
