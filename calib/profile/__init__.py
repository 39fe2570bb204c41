"""Measuring a latency table on a device: what to measure (:mod:`.plan`), how to time it
(:mod:`.timing`), the sweep itself (:mod:`.calibrate`), the monotone fill of the grid
(:mod:`.fill`), bandwidth and gap measures (:mod:`.extra_measures`), the held-out error
(:mod:`.heldout`) and the table's metadata (:mod:`.metadata`)."""
