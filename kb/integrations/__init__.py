"""Training-loop integrations: HF / TRL and Lightning callbacks, `kb.watch` for plain loops, and the run-time
fact collection, tensor probe and reporting they share (imports nothing heavy until a callback is built)."""
