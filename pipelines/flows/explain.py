"""``status --explain``: the stage DAG of a config, stage by stage and collection by collection.

For every stage of :func:`pipelines.flows.dag.pipeline` and every collection: its inputs, its code roots,
the settings in its key with their values in the config (resolved for the collection), the other
entries of its key's config, and the key itself where it can be computed from what is on disk: the
raw files of ``--data-root`` (their sizes and times, nothing is read) and, for a stage with inputs,
their complete outputs in the work dir. Everything comes from the stages' declarations, through the
same calls ``prepare`` and ``run`` make, so the key listed is the key a run would use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.core.collection import ALL_COLLECTIONS, Collection
from pipelines.core.engine import StageOutput, flatten, load_stage
from pipelines.core.errors import PipelineError
from pipelines.core.stages import RawFiles, Stage, StageCall, source_name
from pipelines.flows.dag import DATA_STAGES, data_stage_call, pipeline

_DATA = {stage.name for stage in DATA_STAGES}


def explain_pipeline(config: Any, *, work_dir: Path | str, models: Sequence[str], data_root: Path | str | None = None,
                     collections: Sequence[Collection] | None = None, only: Sequence[str] = ()) -> str:
    """The text of ``status --explain`` (see the module docstring); ``only``: list those stages alone (by name)."""
    from pipelines.flows.prepare import collection_refs, collections_to_prepare, companion_collections, raw_data_key

    work_dir = Path(work_dir)
    order = pipeline(models)
    if data_root is not None:
        chosen, extra = collections_to_prepare(config, data_root, collections)
    else:
        chosen = list(collections or ALL_COLLECTIONS)
        extra = [x for x in dict.fromkeys(x for c in chosen for x in companion_collections(config, c)) if x not in chosen]
    every = [*chosen, *extra]
    raw: dict[str, RawFiles | None] = {}
    for collection in every:
        refs = collection_refs(data_root, collection) if data_root is not None else None
        raw[collection.name] = None if refs is None else RawFiles(refs, raw_data_key(data_root, refs))
    # The data stages of every collection first: a model of one collection may also train on another's graphs.
    outputs: dict[str, dict[str, StageOutput]] = {c.name: {} for c in every}
    shown: dict[tuple[str, str], tuple[StageCall | None, str]] = {}
    for data_first in (True, False):
        for collection in every:
            for stage in order:
                if (stage.name in _DATA) != data_first or (collection in extra and stage.name not in _DATA):
                    continue
                call, missing = _call(stage, config, collection, work_dir, raw[collection.name], outputs,
                                      companions={x.name: x for x in companion_collections(config, collection)})
                key_text, output = _key_text(stage, call, missing, work_dir)
                if output is not None:
                    outputs[collection.name][stage.name] = output
                shown[collection.name, stage.name] = call, key_text
    lines = [f"stage DAG ({len(order)} stages, in run order): {' -> '.join(s.name for s in order)}",
             f"work dir: {work_dir}; keys " + (f"from the raw files of {data_root} and the outputs in the work dir"
                                               if data_root is not None else "need --data-root (the raw files' key)")]
    for collection in every:
        note = " (its data stages only: a model of another collection trains on its graphs)" if collection in extra else ""
        lines += ["", f"{collection.name}{note}"]
        for stage in order:
            if (collection.name, stage.name) in shown and (not only or stage.name in only):
                lines += _describe(stage, config, collection, *shown[collection.name, stage.name])
    return "\n".join(lines)


def _call(stage: Stage, config: Any, collection: Collection, work_dir: Path, raw: RawFiles | None,
          outputs: Mapping[str, Mapping[str, StageOutput]], companions: Mapping[str, Collection],
          ) -> tuple[StageCall | None, str]:
    """The call ``prepare``/``run`` would make of ``stage``, or (None, why it cannot be built yet)."""
    from pipelines.data.prepared import Prepared

    have = outputs.get(collection.name, {})
    if raw is None:
        return None, "needs --data-root"
    missing = [name for name in stage.inputs if name not in have]
    if stage.name in _DATA:
        if missing:
            return None, _no_output(missing)
        return data_stage_call(stage, config, collection, work_dir, raw, have), ""
    if stage.name == "ensemble":
        models = {out.manifest.get("config", {}).get("model", name): out for name, out in have.items()
                  if name in stage.inputs and name not in _DATA}
        if missing:
            return None, _no_output(missing)
        return StageCall(config, collection, work_dir, upstream={"prune": have["prune"]},
                         options={"trained": models}), ""
    # a training stage: the collection's prepared data and that of the collections it also trains on
    if missing:
        return None, _no_output(missing)
    attached = {name: Prepared(other, dict(outputs.get(name, {}))) for name, other in companions.items()
                if all(i in outputs.get(name, {}) for i in stage.inputs)}
    return StageCall(config, collection, work_dir, prepared=Prepared(collection, dict(have), companions=attached)), ""


def _no_output(missing: Sequence[str]) -> str:
    return f"no complete output of {', '.join(missing)} in the work dir"


def _key_text(stage: Stage, call: StageCall | None, missing: str, work_dir: Path) -> tuple[str, StageOutput | None]:
    if call is None:
        return f"key -  (not computable: {missing})", None
    try:
        key = stage.key(call)
    except PipelineError as exc:  # a companion collection not prepared, ...
        return f"key -  (not computable: {exc})", None
    try:
        output = load_stage(work_dir, stage.name, key)
    except PipelineError:
        return f"key {key}  (no complete output)", None
    return f"key {key}  (complete)", output


def _describe(stage: Stage, config: Any, collection: Collection, call: StageCall | None, key_text: str) -> list[str]:
    lines = [f"  {stage.name}  {key_text}" + ("  [training only: predict skips it]" if stage.training_only else ""),
             f"    inputs:   {', '.join(stage.inputs) if stage.inputs else 'the raw files'}",
             f"    code:     {', '.join([*stage.code.roots, *stage.code.shallow])}"]
    settings: list[str] = []
    values = stage.setting_values(config, collection)
    for name, source in sorted(stage.setting_sources(config, collection).items(), key=lambda i: source_name(i[1])):
        value = values[name]
        if isinstance(source, str):
            settings.append(f"{source} = {_json(value)}")
        else:
            settings.append(f"{name} = {source_name(source)}(config, {collection.name}):")
            items = flatten(value) if isinstance(value, Mapping) else {"": value}
            settings += [f"    {k} = {_json(v)}" for k, v in items.items()] or ["    (none)"]
    lines += _block("settings: ", settings or ["(none)"])
    try:
        facts = stage.facts(call if call is not None else StageCall(config, collection))
    except (KeyError, AttributeError):  # the ensemble's name its models' outputs
        facts = {"collection": collection.name}
    if facts:
        lines += _block("also:     ", [f"{k} = {_json(v)}" for k, v in facts.items()])
    return lines


def _block(label: str, rows: Sequence[str]) -> list[str]:
    return [f"    {label}{rows[0]}", *(f"    {' ' * len(label)}{row}" for row in rows[1:])]


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
