"""Requests: synthetic workloads (:mod:`.synthetic`), trace readers (:mod:`.traces`), length and
gap distributions (:mod:`.distributions`), and the request record every source produces
(:mod:`.request_spec`)."""
