"""Observe a live OpenAI-compatible server: replay a scenario's workload on the wall clock and record
what the server did (``cbsim observe``), so ``calibrate --from-run`` and ``validate --against`` can use it."""
