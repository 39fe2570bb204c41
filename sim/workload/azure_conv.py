"""The default request lengths: the Azure LLM inference trace's conversation workload, by quantiles.

Why quantiles and not a lognormal: the trace's output lengths are bimodal (a bulk around 100
tokens and a second mode at 380-450), so no two-parameter curve matches its mean, median and p99
at once: the lognormal with its mean (211) and p99 (601) has a median of 186 where the trace's is
129. Drawing by inverse CDF through these quantiles (linear between knots, rounded) reproduces
the trace's median, p90 and p99 exactly and its mean within 1 % (prompt 1148 vs 1155, output 210
vs 211), with nothing read from disk at run time.

Source: AzureLLMInferenceTrace_conv.csv (Azure/AzurePublicDataset, data/; Patel et al.,
"Splitwise", ISCA 2024; CC-BY 4.0), 19,366 requests of 2023-11-16; ``ContextTokens`` and
``GeneratedTokens`` percentiles (numpy's linear method) at the percentiles below, rounded.
"""

from __future__ import annotations

import numpy as np

PERCENTILES = (0, 1, 2, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90, 95, 97, 98, 99,
               99.5, 99.9, 100)
PROMPT = (2, 29, 91, 181, 207, 372, 387, 396, 403, 414, 703, 984, 1020, 1045, 1071, 1097, 1130, 1189, 1315,
          1876, 2734, 4083, 4090, 4098, 4142, 4831, 6179, 14050)
OUTPUT = (7, 16, 24, 41, 54, 67, 77, 85, 91, 96, 103, 113, 129, 151, 177, 217, 384, 395, 400, 411, 424, 451, 509,
          540, 601, 643, 954, 1000)


def sample(field: str, n: int, generator: np.random.Generator) -> np.ndarray:
    """``n`` lengths of ``field`` ("prompt" or "output") drawn from the trace's quantiles."""
    knots = PROMPT if field == "prompt" else OUTPUT
    u = generator.uniform(0.0, 100.0, n)
    return np.rint(np.interp(u, PERCENTILES, knots)).astype(np.int64)
