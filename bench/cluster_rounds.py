"""Do the clusters an opening wave forms persist? Per-round mean TTFT of a corpus row, clients started together.

What it answers (issue 26, docs/accuracy-corpus.md "The opening wave counted"): a closed-loop benchmark
starts its N clients together; the engine's token budget cuts that wave into clusters whose prompts
prefill in one step, decode in the same steps and end in the same step, so with exact lengths they
send again together. This prints, for corpus rows (``--only`` as in ``bench/silicon_accuracy.py``),
the mean TTFT of each round of N requests, the mean over all of them (what a tool that counts every
request reports) and after the first, under perturbations that might dissolve the clusters:

* ``--think-max-ms J``: a uniform think time in [0, J] ms per request (a send jitter);
* ``--output-spread F`` / ``--prompt-spread F``: output / prompt lengths uniform within ±F of the row's;
* ``--intake-us-per-token B`` (and ``--intake-us A``): a serial FIFO intake in front of the engine,
  one request at a time, A + B x prompt tokens each (an API server's event loop tokenizing each
  prompt). cbsim has no such stage; this probe adds it by wrapping ``sim.clients.Clients`` for the
  run (the send is stamped when the client sends, the engine gets the request when the intake is
  done, and the fast-forward's bound includes the deliveries still in the intake);
* ``--max-num-batched-tokens T``: the engine's token budget.

    .venv/bin/python bench/cluster_rounds.py --only h200_sxm_vllm --only llama_3_1_70b --only _c64_tp2 \\
        --only 1024x1024 --rounds 8 [--intake-us-per-token 5] [--output-spread 0.02]
"""

from __future__ import annotations

import argparse
import heapq
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def serial_intake(a_s: float, b_s: float):
    """Wrap ``Clients.__init__`` and ``Clients.bound`` so each send reaches the router after a FIFO
    intake of ``a_s + b_s x prompt tokens`` per request (the clients' ``deliver`` is delayed; their
    ``all_sent`` waits for the last delivery); returns the undo function."""
    import sim.clients as C

    init, bound = C.Clients.__init__, C.Clients.bound

    def _init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        route, finish = self.deliver, self.all_sent
        self._intake, self._intake_free, self._delivered, self._sent_all = [], 0.0, 0, False

        def deliver(item):
            now = self.env.now
            done = max(now, self._intake_free) + a_s + b_s * item.spec.prompt_tokens
            self._intake_free = done
            heapq.heappush(self._intake, done)

            def land(_):
                heapq.heappop(self._intake)
                self._delivered += 1
                route(item)
                if self._sent_all and self._delivered == self.n:  # the engine may stop once all is in
                    finish()

            self.env.timeout(done - now).callbacks.append(land)

        def all_sent():
            self._sent_all = True
            if self._delivered == self.n:
                finish()

        self.deliver, self.all_sent = deliver, all_sent

    def _bound(self, own, replicas):
        b = bound(self, own, replicas)
        waiting = self.__dict__.get("_intake")
        return min(b, waiting[0]) if waiting else b

    C.Clients.__init__, C.Clients.bound = _init, _bound

    def undo():
        C.Clients.__init__, C.Clients.bound = init, bound

    return undo


def spread(value: int, f: float) -> dict:
    return {"dist": "uniform", "min": max(1, round(value * (1 - f))), "max": round(value * (1 + f))}


def main(argv=None) -> int:
    import silicon_accuracy as sa

    import sim

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="keep rows whose id/GPU/engine/model contain this")
    ap.add_argument("--rounds", type=int, default=8, help="requests per client (default 8)")
    ap.add_argument("--max-rows", type=int, default=3, help="rows simulated at most (default 3)")
    ap.add_argument("--think-max-ms", type=float, default=0.0)
    ap.add_argument("--output-spread", type=float, default=0.0)
    ap.add_argument("--prompt-spread", type=float, default=0.0)
    ap.add_argument("--intake-us", type=float, default=0.0)
    ap.add_argument("--intake-us-per-token", type=float, default=0.0)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    args = ap.parse_args(argv)
    for name in ("output_spread", "prompt_spread"):
        if not 0 <= getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be in [0, 1)")
    rows = sa.select(sa.read_rows(), args.only)
    sa.classify(rows)
    rows = [r for r in rows if not r.skip][: args.max_rows]
    if not rows:
        raise SystemExit("no priced row matches --only")
    undo = serial_intake(args.intake_us * 1e-6, args.intake_us_per_token * 1e-6) \
        if args.intake_us or args.intake_us_per_token else None
    try:
        for row in rows:
            key, digest = row.table_key, sa.code_hash()
            _, table, err = sa.build_one((key, digest))
            if err:
                print(f"{row.id}: kernel database: {err}")
                continue
            sc = sa.scenario_of(row, table, args.rounds, 0.0)
            w, isl, osl = sc["workload"], row.isl, row.osl
            if args.output_spread:
                w["output_tokens"] = spread(osl, args.output_spread)
                osl = w["output_tokens"]["max"]
                w["max_tokens"] = osl
            if args.prompt_spread:
                w["prompt_tokens"] = spread(isl, args.prompt_spread)
                isl = w["prompt_tokens"]["max"]
            sc["engine"]["max_model_len"] = isl + osl + 16
            if args.max_num_batched_tokens:
                sc["engine"]["max_num_batched_tokens"] = args.max_num_batched_tokens
            if args.think_max_ms:
                w["arrival"]["think_time_s"] = {"dist": "uniform", "min": 0, "max": args.think_max_ms * 1e-3}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                req = sim.run(sc).requests.sort_values("arrival_s")
            n = row.concurrency
            per = [req["ttft_s"].iloc[i * n:(i + 1) * n].mean() * 1e3 for i in range(args.rounds)]
            print(f"{row.id}: real TTFT {row.ttft_ms:.0f} ms, TPOT {row.tpot_ms:.1f} ms; simulated TPOT "
                  f"{req['tpot_s'].mean() * 1e3:.1f} ms")
            print("  TTFT per round (ms): " + " ".join(f"{x:.0f}" for x in per)
                  + f" | mean of all {req['ttft_s'].mean() * 1e3:.0f}, after round 1 "
                  f"{req['ttft_s'].iloc[n:].mean() * 1e3:.0f}")
    finally:
        if undo is not None:
            undo()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
