"""Runs a real engine recorded: step logs (:mod:`.steplog`), step-for-step conformance of a policy
with them (:mod:`.conformance`), and simulated-versus-measured validation (:mod:`.validate_against`)."""
