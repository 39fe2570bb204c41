"""Speculative decoding: the acceptance of draft tokens, the draft model's cost on the clock, and
the run's acceptance report (the scheduling side lives in the policy: ``policies/vllm_v1.py``)."""
