"""The seed a model fits with, from a run seed and its config section's seed offset.

Config seeds lie in [0, 2^32) (numpy and torch take them), but LightGBM's seeds are C ``int32``: a
seed of 2^31 or more trains the same model as a smaller one (2^31 and 2^32 both train seed 0's), and
the sum of a run seed and an offset can exceed 2^32. :func:`fit_seed` therefore keeps the sum where
it is below 2^31 (the seeds every run so far trained with, so their results stand) and mixes the two
through numpy's ``SeedSequence`` into [0, 2^31) otherwise: distinct pairs get distinct seeds but for
the chance collisions of a 31-bit hash, never the systematic aliasing of a wrapped integer.
"""

from __future__ import annotations

FIT_SEED_LIMIT = 2**31  # LightGBM's int32; numpy and torch take any of these


def fit_seed(run_seed: int, offset: int = 0, fold: int | None = None) -> int:
    """The seed of a fit for ``run_seed`` and a model's seed ``offset`` (``gbdt.seed``), in [0, 2^31).

    With ``fold`` (a model's ``fold_seeds``), each fold model of the run seed gets a seed of its own,
    mixed from all three, so the fold models start from different weights and draw different samples.
    """
    run_seed, offset = int(run_seed), int(offset)
    if run_seed < 0 or offset < 0 or (fold is not None and int(fold) < 0):
        raise ValueError(f"seeds are non-negative, got run seed {run_seed}, offset {offset} and fold {fold}")
    total = run_seed + offset
    if fold is None and total < FIT_SEED_LIMIT:
        return total
    import numpy as np

    entropy = [run_seed, offset] if fold is None else [run_seed, offset, int(fold)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0] >> 1)


def model_fit_seed(run_seed: int, fold: int, settings: dict) -> int:
    """:func:`fit_seed` of one fold model from its model's resolved settings (``seed``, ``fold_seeds``)."""
    return fit_seed(run_seed, settings.get("seed", 0), fold if settings.get("fold_seeds", False) else None)
