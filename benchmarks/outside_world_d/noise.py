"""Measurement noise: per-graph jitter level, lognormal jitter, rare outliers."""
import zlib

import numpy as np


def rng_for(seed, key):
    """Independent stream per (seed, file), whatever the processing order."""
    h = zlib.crc32(key.encode("utf-8")) & 0xFFFFFFFF
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, h, 0x0D]))


def measure(rng, noise_free, sigma):
    """One timed run per entry: exp(N(0,sigma)) jitter; 1.5% of runs hit an
    outlier (preemption, cache/DMA contention) that adds 5-60%."""
    x = np.asarray(noise_free, dtype=np.float64)
    mult = np.exp(rng.normal(0.0, sigma, size=x.shape))
    out = rng.random(x.shape) < 0.015
    mult = mult * np.where(out, 1.0 + rng.uniform(0.05, 0.6, size=x.shape), 1.0)
    return np.maximum(np.rint(x * mult), 1).astype(np.int64)


def graph_sigma(rng):
    """Jitter level of one graph's measurement session: 0.8% - 3%."""
    return float(rng.uniform(0.008, 0.03))
