"""Measuring a drafter on a served engine: paired intervals and the stopping rule (`intervals`), one window's
rounds (`rounds`), the verdict (`verdict`), and windows measured before and reused (`reused`)."""
