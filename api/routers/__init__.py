"""One router per resource: ask, diagnose, incidents (+ repro), jobs, health/metrics."""
