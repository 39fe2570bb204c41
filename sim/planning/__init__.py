"""Many runs of one scenario: rate and field sweeps (:mod:`.sweep`), the highest rate meeting an SLO
(:mod:`.capacity`), and replicas and cost for a target rate (:mod:`.plan`)."""
