"""The main job of ``make demo``: ``run`` on a synthetic world in the Kaggle layout.

Generates (or reuses: a complete world of the same arguments is left alone) the synthetic world,
then runs :func:`pipelines.flows.run.run_pipeline` on it with the demo's config (:func:`demo_config`): every preparation
stage, the models the config names, the ensemble and a validated submission in a new
``submissions/<run-id>/`` folder. :func:`demo_summary` is the out-of-fold table the command prints
(per collection and model: mean +- spread over seeds; the ensemble; the combined score). A second
demo reuses every cached stage and writes the same CSV bytes to a new run folder.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from typing import TYPE_CHECKING

from pipelines.core.paths import SUBMISSIONS_DIR, WORK_DIR

if TYPE_CHECKING:
    from pipelines.flows.scores import RunResult

logger = logging.getLogger(__name__)

DEMO_CONFIG = "demo"
# A scale whose world the demo config does not fit, and the config it runs instead: the tiny world's
# layout collections hold 3 program families, fewer than the demo config's 5 grouped folds.
SCALE_CONFIGS = {"tiny": "smoke"}


def demo_config(scale: str) -> tuple[str, str]:
    """The config ``demo --scale SCALE`` runs without ``--config``, and why."""
    if scale in SCALE_CONFIGS:
        return SCALE_CONFIGS[scale], (f"the {scale} world has fewer program families than the {DEMO_CONFIG} config's "
                                      f"5 folds; {SCALE_CONFIGS[scale]} is sized for it: seconds, scores mean nothing")
    return DEMO_CONFIG, "the demo's config: base with a lighter GNN schedule and one seed"


def run_demo(data_root: Path | str, scale: str = "small", seed: int = 0, *,
             submissions_dir: Path | str = SUBMISSIONS_DIR, work_dir: Path | str = WORK_DIR,
             config: str | Path | None = None, overrides: Sequence[str] = ()) -> RunResult:
    """Generate (or reuse) the synthetic world and run the whole pipeline on it with ``config`` (default:
    :func:`demo_config` of the scale)."""
    from pipelines.config.settings import load_config
    from pipelines.flows.run import resolve_models, run_pipeline
    from pipelines.synth import generate_world

    logger.info(generate_world(Path(data_root), scale=scale, seed=seed))
    resolved = load_config(config if config is not None else demo_config(scale)[0], overrides)
    models = resolve_models(resolved, None)
    return run_pipeline(resolved, data_root, work_dir=work_dir, models=models, submissions_dir=submissions_dir)


def demo_summary(result: RunResult, data_root: Path | str, scale: str, seed: int, work_dir: Path | str) -> str:
    """The out-of-fold table of a demo run, headed by its world and how many stages were reused."""
    from pipelines.flows.run import indexed_stage_count

    stages = indexed_stage_count(result.manifest["stages"])
    reused = stages - len(result.computed)
    return (f"\nout-of-fold scores on {data_root} ({scale} world, seed {seed}; {reused}/{stages} stages reused "
            f"from {work_dir}):\n{result.describe()}")
