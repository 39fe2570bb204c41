"""bench/cluster_rounds.py's serial intake: a FIFO stage in front of the engine, one request at a time.

Closed form on constant 0.25 s steps: four clients send at t = 0, the intake takes 0.1 s a request, so
the engine gets them at 0.1, 0.2, 0.3, 0.4 s; the first prefills alone in [0.1, 0.35], the next two
(there by 0.35) together in [0.35, 0.6], the last in [0.6, 0.85]. TTFT counts from the client's send.
"""

from __future__ import annotations

import pytest

from tests.test_closed_loop import scenario


def test_serial_intake_delays_each_request_behind_the_ones_before_it_and_is_undone():
    import sim.clients as C
    from bench.cluster_rounds import serial_intake
    from sim.runner import run

    before = (C.Clients._send, C.Clients.bound)
    undo = serial_intake(0.1, 0.0)
    try:
        req = run(scenario(4, n=4, output=2)).requests.sort_values("arrival_s")
    finally:
        undo()
    assert (C.Clients._send, C.Clients.bound) == before
    assert req["arrival_s"].tolist() == [0.0] * 4  # stamped at the client's send
    assert req["ttft_s"].tolist() == pytest.approx([0.35, 0.6, 0.6, 0.85])
    plain = run(scenario(4, n=4, output=2)).requests
    assert plain["ttft_s"].tolist() == [0.25] * 4  # without it: one wave, one step


def test_per_token_intake_scales_with_the_prompt():
    from bench.cluster_rounds import serial_intake
    from sim.runner import run

    undo = serial_intake(0.0, 1e-3)  # 1 ms a token: 100-token prompts take 0.1 s each, as above
    try:
        req = run(scenario(4, n=4, output=2)).requests.sort_values("arrival_s")
    finally:
        undo()
    assert req["ttft_s"].tolist() == pytest.approx([0.35, 0.6, 0.6, 0.85])
