"""GNN throughput and peak memory on the largest pruned layout graph (base config, 2 threads by default).

Usage: python -m benchmarks.gnn_throughput [--work DIR] [--copies 1,2] [--steps N] [--eval-configs N]
                                           [--device cpu,cuda] [--precision fp32,bf16] [--set gnn.KEY=VALUE ...]
                                           [--threads N] [--modes train,predict] [--ops N]

On a GPU workstation: ``python -m benchmarks.gnn_throughput --device cpu,cuda --precision fp32,bf16``
(or ``make bench-gpu``) compares the same machine's CPU with its GPU.

Takes the layout graph with the most nodes among the node-arrays stage outputs under ``--work``
(``make bench`` writes them to benchmarks/worlds/work), i.e. a graph *after* pruning. With
``--copies 2`` the graph is also measured as two disjoint copies joined into one graph: twice the
nodes and configurable nodes, a stress case beyond the real maximum (3,143 configurable nodes).

Each figure comes from a fresh process, so its peak RSS is its own:
* train: ``trainer.train_step`` with K configs (the base config's ``configs_per_graph``), after
  one warm-up step; configs/s = K x steps / seconds. Peak RSS includes the graph's arrays.
* predict: every one of ``--eval-configs`` configs scored the way ``GNNRanker.predict`` does
  (encode once, chunks sized by ``eval_chunk`` / ``eval_chunk_mb``, ``eval_chunk_mb_cuda`` on a GPU).
With ``--ops N`` a training figure also times as many steps again op by op (``benchmarks/op_timer.py``; not
``torch.profiler``, whose allocations break the CPU heap reuse and inflate the large ops 2-3x) and prints
the N (op, input shape) pairs that took longest per step.
``cpu s`` is the process's CPU time over the timed span. On a shared machine, compare code versions with
``--threads 1`` and ``cpu s``: with two threads a busy neighbour makes each OpenMP team wait (and spin)
for its descheduled partner, which inflates wall *and* CPU time erratically.

On a GPU the graph is copied to the device once (as ``trainer.DeviceBatches`` does in a fit) and
the clock stops after ``torch.cuda.synchronize()``; ``H2D KB/step`` is what a training step copies
to the device (the bytes of the tensors of the K sampled configs' ``ConfigBatch``, which
``.to(device)`` moves), ``H2D KB/graph`` what the graph's ``GraphBatch`` copies once per fit (both
printed on CPU too, where the copies are no-ops), ``peak device MB`` is ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, Sequence

from benchmarks.common import WORLDS, markdown_table, measure

_BODY = """
import time
from dataclasses import replace
import numpy as np
import torch
from pipelines.config.settings import load_config, resolve_for_collection
from pipelines.models.gnn.batch import collate, gather_configs, prepare_for
from pipelines.models.gnn.device import heap_reuse_on, resolve_device
from pipelines.models.gnn.losses import make_loss
from pipelines.models.gnn.model import GNNModel
from pipelines.models.gnn.trainer import DeviceBatches, configs_per_chunk, sample_configs, score_graph, train_step
from pipelines.data.node_arrays import GraphArrays, load_graph_arrays

def tensor_bytes(obj):
    # bytes of every tensor of a batch dataclass (also inside lists and nested dataclasses)
    def size(value):
        if isinstance(value, torch.Tensor):
            return value.nbytes
        if isinstance(value, list):
            return sum(size(v) for v in value)
        return tensor_bytes(value) if hasattr(value, "__dataclass_fields__") else 0
    return sum(size(getattr(obj, name)) for name in obj.__dataclass_fields__)

def union(graph, copies):
    if copies == 1:
        return graph
    n, nc = graph.num_nodes, graph.config_nodes.shape[0]
    return GraphArrays(
        collection=graph.collection, stem=graph.stem, split=graph.split,
        node_opcode=np.tile(graph.node_opcode, copies), node_feat=np.tile(graph.node_feat, (copies, 1)),
        message_edges=np.concatenate([graph.message_edges + i * n for i in range(copies)], axis=1),
        config_nodes=np.concatenate([graph.config_nodes + i * n for i in range(copies)]),
        config_feat=np.concatenate([graph.config_feat] * copies, axis=1),
        target=graph.target, config_index=graph.config_index,
        # the chain ends of every copy (rows among the configurable nodes, -1 = a fixed-layout end)
        chain_src=np.concatenate([np.where(graph.chain_src >= 0, graph.chain_src + i * nc, -1) for i in range(copies)]),
        chain_dst=np.concatenate([np.where(graph.chain_dst >= 0, graph.chain_dst + i * nc, -1) for i in range(copies)]),
        **{{name: np.concatenate([getattr(graph, name)] * copies)
            for name in ("chain_kernel", "chain_src_layout", "chain_dims", "chain_bytes")}})

torch.set_num_threads({threads})
cfg = replace(resolve_for_collection(load_config(None, {overrides!r}).gnn, {collection!r}), device={device!r}, precision={precision!r})
device = resolve_device(cfg.device)
cuda = device.type == "cuda"
heap = heap_reuse_on(device, cfg.cpu_heap_reuse)  # as a fit does, for the rest of the process
heap.__enter__()  # (the reference keeps it open: a collected one would close)
def sync():
    if cuda:
        torch.cuda.synchronize(device)
graph = union(load_graph_arrays({path!r}), {copies})
prepared = prepare_for(graph, cfg)
torch.manual_seed(0)
model = GNNModel(cfg, graph.node_feat.shape[1], "layout").to(device)
batches = DeviceBatches(device)
rng = np.random.default_rng(0)
result = {{"nodes": graph.num_nodes, "config_nodes": int(graph.config_nodes.shape[0]),
           "rows": int(prepared.varying_rows.shape[0]), "configs": graph.num_configs, "device": str(device)}}
if {mode!r} == "train":
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    loss_fn = make_loss(cfg.loss, cfg.margin)
    def step():
        idx = sample_configs(rng, graph.num_configs, cfg.configs_per_graph)
        return train_step(model, [prepared], [idx], loss_fn, optimizer, cfg.grad_clip,
                          batch=batches.get([prepared], 0), precision=cfg.precision)
    step()
    sync()
    started, cpu_started = time.perf_counter(), time.process_time()
    losses = [step() for _ in range({steps})]
    torch.stack(losses).tolist()  # what the trainer reads back, once per epoch
    sync()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    # what ``.to(device)`` moves: a step's K sampled configs, and the graph batch once per fit
    sample = gather_configs([prepared], [sample_configs(rng, graph.num_configs, cfg.configs_per_graph)])
    result.update(seconds=seconds, cpu_seconds=cpu_seconds, configs_per_s=cfg.configs_per_graph * {steps} / seconds,
                  h2d_kb=tensor_bytes(sample) / 1024, graph_h2d_kb=tensor_bytes(collate([prepared])) / 1024)
    if {ops}:  # where a step's time goes, after the clean timing above (benchmarks/op_timer.py)
        from benchmarks.op_timer import OpTimer
        with OpTimer():
            step()  # the first step under the mode allocates what later ones reuse
        with OpTimer() as timer:
            started = time.perf_counter()
            for _ in range({steps}):
                step()
            sync()
            step_s = (time.perf_counter() - started) / {steps}
        result.update(ops=timer.top({ops}, {steps}), ops_s=timer.seconds({steps}), ops_step_s=step_s, steps={steps})
else:
    idx = np.arange({eval_configs}) % graph.num_configs
    score_graph(model, prepared, cfg, idx[:configs_per_chunk(cfg, prepared, device.type)])  # warm-up: one chunk (CUDA kernels, allocator)
    sync()
    started, cpu_started = time.perf_counter(), time.process_time()
    score_graph(model, prepared, cfg, idx)
    sync()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    result.update(seconds=seconds, cpu_seconds=cpu_seconds, configs_per_s={eval_configs} / seconds,
                  chunk=configs_per_chunk(cfg, prepared, device.type))
result["peak_device_mb"] = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else 0.0
"""


def largest_layout_graph(work: Path) -> tuple[Path, str]:
    """Path and collection of the node-arrays file with the most nodes (layout graphs only)."""
    from pipelines.data.node_arrays import load_graph_arrays

    best: tuple[int, Path, str] | None = None
    for path in sorted(work.glob("node_arrays/*/*/*.npz")):
        graph = load_graph_arrays(path)
        if graph.config_feat.ndim == 3 and (best is None or graph.num_nodes > best[0]):
            best = (graph.num_nodes, path, graph.collection)
    if best is None:
        raise SystemExit(f"no layout node arrays under {work}/node_arrays: run `make bench` (or its data stages)")
    return best[1], best[2]


def measured_code(path: Path, collection: str, mode: str, *, copies: int = 1, steps: int = 5,
                  eval_configs: int = 1000, device: str = "cpu", precision: str = "fp32",
                  overrides: Sequence[str] = (), threads: int = 2, ops: int = 0) -> str:
    """The body ``common.measure`` runs for one figure: ``mode`` "train" (``steps`` training steps) or
    "predict" (``eval_configs`` configs scored) on the graph at ``path``; with ``ops``, "train" also
    times ``steps`` more steps op by op and returns the ``ops`` longest (op, shape) pairs."""
    return _BODY.format(collection=collection, path=str(path), copies=copies, mode=mode, steps=steps,
                        eval_configs=eval_configs, device=device, precision=precision, overrides=list(overrides),
                        threads=threads, ops=ops)


def measure_throughput(work: Path, *, copies: Sequence[int] = (1, 2), steps: int = 5, eval_configs: int = 1000,
                       devices: Sequence[str] = ("cpu",), precisions: Sequence[str] = ("fp32",), nice: int = 0,
                       overrides: Sequence[str] = (), threads: int = 2, modes: Sequence[str] = ("train", "predict"),
                       ops: int = 0, log=print, on_row: Callable[[list[list]], None] | None = None) -> list[list]:
    """One row per (device, precision, copies, mode), each from a fresh process; ``on_row`` gets the
    rows so far after each (a caller that writes them keeps what a stopped run measured). With ``ops``,
    each training figure also logs its step's ``ops`` longest ops (``ops_table``)."""
    path, collection = largest_layout_graph(work)
    log(f"GNN throughput on {path} ({collection})")
    rows = []
    for device in devices:
        for precision in precisions:
            for count in copies:
                for mode in modes:
                    r = measure(measured_code(path, collection, mode, copies=count, steps=steps,
                                              eval_configs=eval_configs, device=device, precision=precision,
                                              overrides=overrides, threads=threads, ops=ops), nice=nice)
                    rows.append([r["device"], precision, mode, count, r["nodes"], r["config_nodes"], r["rows"],
                                 r["seconds"], r["cpu_seconds"], r["configs_per_s"], r.get("h2d_kb", "-"),
                                 r.get("graph_h2d_kb", "-"), r["peak_rss_mb"],
                                 r["peak_device_mb"] or "-"])
                    log(f"  {r['device']:<6} {precision} {mode:<7} x{count}: {r['nodes']} nodes, "
                        f"{r['config_nodes']} configurable, {r['configs_per_s']:.1f} configs/s, "
                        + (f"H2D {r['h2d_kb']:.0f} KB/step + {r['graph_h2d_kb']:.0f} KB/graph, "
                           if "h2d_kb" in r else "") +
                        f"peak {r['peak_rss_mb']:.0f} MB RSS, {r['peak_device_mb']:.0f} MB device")
                    if "ops" in r:
                        log("\n".join(ops_table(r)))
                    if on_row is not None:
                        on_row(list(rows))
    return rows


def ops_table(result: dict) -> list[str]:
    """A training figure's longest ops per step, and how much of the step the ops hold."""
    lines = [f"  one step op by op: {result['ops_s'] * 1000:.0f} ms in ops of {result['ops_step_s'] * 1000:.0f} ms "
             f"(the timer's step; without it {result['seconds'] / result['steps'] * 1000:.0f} ms)"]
    return lines + markdown_table(["op", "first input's shape", "ms per step", "calls per step"], result["ops"])


def table(rows: list[list]) -> list[str]:
    header = ["device", "precision", "mode", "copies", "nodes", "configurable nodes", "config-dependent rows",
              "seconds", "cpu s (process)", "configs/s", "H2D KB/step", "H2D KB/graph (once per fit)", "peak RSS MB",
              "peak device MB"]
    return markdown_table(header, rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=WORLDS / "work")
    parser.add_argument("--copies", default="1,2", help="comma-separated copy counts of the graph to measure")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--eval-configs", type=int, default=1000)
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="comma-separated gnn.device values: cpu, cuda, auto")
    parser.add_argument("--precision", default="fp32", help="comma-separated gnn.precision values: fp32, bf16")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                        help="config override, e.g. gnn.config_pairs=false (repeatable)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the measured process")
    parser.add_argument("--modes", default="train,predict", help="comma-separated: train, predict")
    parser.add_argument("--ops", type=int, default=0,
                        help="also time training steps op by op and print the N longest (benchmarks/op_timer.py)")
    args = parser.parse_args(argv)
    rows = measure_throughput(args.work, copies=[int(c) for c in args.copies.split(",")], steps=args.steps,
                              eval_configs=args.eval_configs, devices=args.device.split(","),
                              precisions=args.precision.split(","), nice=args.nice, overrides=args.overrides,
                              threads=args.threads, modes=args.modes.split(","), ops=args.ops)
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
