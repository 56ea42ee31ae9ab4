"""``records FILE... --out DIR``: TpuGraphs tuning records (``tuning.proto``) as a data root of measured graphs.

Each file (a ``TuningData`` or a ``ModuleTuningData``, see :mod:`pipelines.hlo.records`) gives one
graph per module: a layout graph (runs of layout configs) in each ``--layout-collection`` (default
``layout:xla:default``: records come from the compiler's own autotuner, which explores around the
default as that collection's search does; ``all``: the four layout collections) or a tile graph in
``tile:xla``, with the measured runtimes. They go into ``DIR`` in the Kaggle layout
(``DIR/npz/<collection>/<split>/<stem>.npz``), the data root that ``train``, ``run``, ``predict`` and
``evaluate`` read. ``train`` takes any collections; ``run`` and ``predict`` publish a submission, which
covers all five collections, so their root needs train and test graphs in each (layout records with
``--layout-collection all``, and tile records):

* ``--split train`` (default), ``valid`` or ``test`` puts every graph of the files in that split;
  ``--split fingerprint`` splits by each module's fingerprint as the official encoder does (fingerprint /
  2^64 in [0, 0.8] train, up to 0.9 valid, the rest test);
* train and valid graphs carry their runtimes in ``config_runtime`` (and tile normalizers), as the
  Kaggle train files do; a **test** graph is written as the Kaggle test files are (runtimes 0,
  normalizers 1) and its measured runtimes go to the hidden-label sidecar ``DIR/labels/`` (the format
  ``synth`` writes), so ``evaluate`` scores a run's test submission on them. Records carry no
  noise-free runtime: the sidecar's ``noise_free`` is the measured one, and the ceiling is 1;
* ``DIR/sample_submission.csv`` lists every test graph of the root (rewritten on each call);
  ``DIR/records.json`` names, per file and module, the graph written (collection, split, stem) or why
  none was, the runs kept and the runs dropped by reason.

Calls add to one ``DIR`` (e.g. a train file, then a test file). A graph whose stem the root already
holds is refused, as is a ``DIR`` that holds anything this command did not write; every file is read
and checked before the first byte is written, and one process at a time writes into a ``DIR``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipelines.core.atomic import write_text_atomic
from pipelines.core.collection import ALL_COLLECTIONS, SPLITS, TILE_XLA, Collection, parse_collection
from pipelines.core.errors import ConfigError, FormatError, PipelineError
from pipelines.data.root import DEFAULTS_FILE, DataRoot
from pipelines.synth.world import RECORDS_GENERATOR

logger = logging.getLogger(__name__)

GENERATOR = RECORDS_GENERATOR
RECORDS_VERSION = 1
SIDECAR = "records.json"
SPLIT_CHOICES = (*SPLITS, "fingerprint")
FINGERPRINT_SPLIT = ((0.8, "train"), (0.9, "valid"), (1.0, "test"))  # SplitToFingerprintRange


@dataclass
class RecordsResult:
    root: Path
    written: list[dict[str, Any]]  # per graph: file, module, collection, split, stem, path
    left_out: list[dict[str, Any]]  # per module without a graph: file, module, reason
    sidecar: Path


def fingerprint_split(fingerprint: int) -> str:
    """The official encoder's split of a module by its fingerprint (train:valid:test = 0.8:0.1:0.1)."""
    share = fingerprint / float(1 << 64)
    return next(split for bound, split in FINGERPRINT_SPLIT if share <= bound)


def layout_collections(names: str | Sequence[str]) -> list[Collection]:
    """``--layout-collection`` values: layout collection names, or ``all`` for the four."""
    names = [names] if isinstance(names, str) else list(names)
    if "all" in names:
        return [c for c in ALL_COLLECTIONS if c.is_layout]
    chosen = [parse_collection(n) for n in names]
    if not chosen or any(not c.is_layout for c in chosen):
        raise ConfigError(f"--layout-collection must name layout collections (or all), got {names!r}")
    return list(dict.fromkeys(chosen))


def records_to_data_root(files: Sequence[Path | str], out: Path | str, *, split: str = "train",
                         layout_collection: str | Sequence[str] = "layout:xla:default") -> RecordsResult:
    """Write the graphs of the records ``files`` into the data root ``out`` (see the module docstring)."""
    from pipelines.hlo import out_folder_lock
    from pipelines.hlo.records import record_graphs

    if split not in SPLIT_CHOICES:
        raise ConfigError(f"--split must be one of {', '.join(SPLIT_CHOICES)}, got {split!r}")
    layouts = layout_collections(layout_collection)
    if not files:
        raise ConfigError("records needs at least one records file")
    out = Path(out)
    planned: list[tuple[Path, Any, Collection, str]] = []
    entries: list[dict[str, Any]] = []
    for file in map(Path, files):
        kind, graphs = record_graphs(file)
        modules = []
        for record in graphs:
            summary = record.summary()
            if record.graph is not None:
                collections = layouts if record.kind == "layout" else [TILE_XLA]
                where = fingerprint_split(record.fingerprint) if split == "fingerprint" else split
                summary |= {"collections": [c.name for c in collections], "split": where}
                planned += [(file, record, collection, where) for collection in collections]
            modules.append(summary)
        entries.append({"file": str(file), "message": kind, "modules": modules})
    stems = [(collection, record.stem) for _, record, collection, _ in planned]
    repeated = sorted({f"{c.name}:{s}" for c, s in stems if stems.count((c, s)) > 1})
    if repeated:
        raise FormatError(files[0] if len(files) == 1 else out,
                          f"the same module twice (one graph name): {', '.join(repeated[:5])}")
    if out.is_dir():
        _existing_record(out)  # a folder `records` did not make is refused before the lock file is created
    with out_folder_lock(out, "records", data_root_ok=True):
        return _write(out, planned, entries, split, layouts)


def _write(out: Path, planned: list[tuple[Path, Any, Collection, str]], entries: list[dict[str, Any]], split: str,
           layouts: list[Collection]) -> RecordsResult:
    from pipelines.data.tpugraphs import save_graph
    from pipelines.flows.rank import write_sample_submission

    sidecar = out / SIDECAR
    record = _existing_record(out)
    clashes = [str(p) for _, r, c, _ in planned for s in SPLITS if (p := _graph_path(out, c, s, r.stem)).exists()]
    if clashes:
        raise PipelineError(f"{out}: already holds {len(clashes)} of these graphs ({', '.join(clashes[:3])}); "
                            "nothing was written (remove them, or write into another --out)")
    written = []
    touched = {c for _, _, c, _ in planned}
    for collection in touched:
        for name in SPLITS:
            _graph_path(out, collection, name, "x").parent.mkdir(parents=True, exist_ok=True)
    for file, graph_record, collection, where in planned:
        graph = graph_record.graph
        path = _graph_path(out, collection, where, graph_record.stem)
        if where == "test":
            _write_hidden_labels(out, collection, graph_record.stem, graph)
            graph = _as_test_graph(graph)
        save_graph(path, graph)
        written.append({"file": str(file), "module": graph_record.module, "collection": collection.name,
                        "split": where, "stem": graph_record.stem, "configs": int(graph.num_configs),
                        "path": str(path)})
    if any(w["split"] == "test" for w in written) or (out / "labels").is_dir():
        _write_labels_marker(out)
    _write_defaults(out, {(c.name, r.stem): int(r.facts["default_index"]) for _, r, c, _ in planned})
    write_sample_submission(DataRoot(out))
    record["calls"].append({"split": split, "layout_collections": [c.name for c in layouts], "files": entries})
    write_text_atomic(sidecar, json.dumps(record, indent=1) + "\n")
    left_out = [{"file": e["file"], "module": m["module"], "reason": m["left_out"]}
                for e in entries for m in e["modules"] if m["left_out"]]
    for item in left_out:
        logger.warning(f"{item['file']}: module {item['module']} left out: {item['reason']}")
    return RecordsResult(out, written, left_out, sidecar)


def _write_defaults(out: Path, found: dict[tuple[str, str], int]) -> None:
    """Add each graph's default config (the run marked ``is_default``) to the root's ``defaults.json``."""
    defaults = DataRoot(out).defaults()
    for (collection, stem), index in found.items():
        defaults.setdefault(collection, {})[stem] = index
    write_text_atomic(out / DEFAULTS_FILE, json.dumps(defaults, indent=1, sort_keys=True) + "\n")


def _graph_path(root: Path, collection: Collection, split: str, stem: str) -> Path:
    return DataRoot(root).new_split_dir(collection, split, kaggle=False) / f"{stem}.npz"


def _existing_record(out: Path) -> dict[str, Any]:
    """The root's ``records.json``; a fresh one for an empty folder; a PipelineError for a folder this
    command did not make (a Kaggle download, a synthetic world, anything else)."""
    sidecar = out / SIDECAR
    if sidecar.is_file():
        try:
            record = json.loads(sidecar.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise FormatError(sidecar, f"unreadable ({type(exc).__name__}: {exc}); nothing was written") from None
        if not isinstance(record, dict) or record.get("generator") != GENERATOR or not isinstance(record.get("calls"),
                                                                                                   list):
            raise FormatError(sidecar, f"not written by `records`; nothing was written")
        return record
    others = [p.name for p in out.iterdir() if p.name != ".records.lock"]
    if others:
        raise PipelineError(f"{out}: holds {', '.join(sorted(others)[:5])} and no {SIDECAR}: not a data root `records` "
                            "made; nothing was written (pass a new or empty --out)")
    return {"generator": GENERATOR, "version": RECORDS_VERSION, "calls": []}


def _as_test_graph(graph: Any) -> Any:
    """The graph as a Kaggle test file holds it: runtimes 0 (tile normalizers 1)."""
    import dataclasses

    zeros = np.zeros(graph.num_configs, dtype=np.int64)
    if graph.CONFIG_ARRAY == "config_feat":
        return dataclasses.replace(graph, config_runtime=zeros, config_runtime_normalizers=np.ones_like(zeros))
    return dataclasses.replace(graph, config_runtime=zeros)


def _write_hidden_labels(root: Path, collection: Collection, stem: str, graph: Any) -> None:
    from pipelines.synth.world import Labels, label_path, write_labels

    normalizer = graph.config_runtime_normalizers if collection.is_tile else None
    write_labels(label_path(root, collection, "test", stem),
                 Labels(graph.config_runtime.astype(np.int64), graph.config_runtime.astype(np.float64), normalizer))


def _write_labels_marker(root: Path) -> None:
    from pipelines.core.collection import ALL_COLLECTIONS
    from pipelines.synth.world import LABELS_DIR, LABELS_MARKER

    labelled = [c.name for c in ALL_COLLECTIONS
                if root.joinpath(LABELS_DIR, "npz", *c.relative_dir.parts, "test").is_dir()]
    marker = {"generator": GENERATOR, "version": RECORDS_VERSION, "collections": labelled,
              "note": "measured runtimes of tuning records; noise_free is the measured runtime (ceiling 1)"}
    write_text_atomic(root / LABELS_DIR / LABELS_MARKER, json.dumps(marker, indent=1) + "\n")
