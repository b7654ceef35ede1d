"""The checks that need NVIDIA GPUs, in one short run (`benchmarks/gpu_check.sh`, ≤ 5 minutes), printed as one
table. Without a GPU it says so and exits 0; with one it exits 1 if any check fails.

1. NVML's facts through nvidia-ml-py, and `gpu_statuses()` / `find_usable_cuda_devices()` through NVML and
   through probes, with CUDA still uninitialised in this process afterwards.
2. A busy GPU: a child holds GPU 0; NVML lists its pid there, and in EXCLUSIVE_PROCESS mode the GPU is reported
   busy (the mode is never changed here: a GPU in Default mode stays usable, and that is checked instead).
3. The metric store on CUDA: 1000 0-d device keys and CPU-stored keys, synced through a stubbed world of 2 (CPU
   keys moved to the device once per bucket), against the same values computed by hand; its cost beside the
   floor (stack, one tolist) and beside one `.item()` per key (K device synchronisations).
4. With 2 GPUs or more: a 2-GPU `tp.launch` world over NCCL whose metric store reduces CPU-stored and device
   keys, checked against the known sums.
5. Memory on CUDA: the 21M-parameter test decoder's training step on cuda:0 (tests/scripts/memory_world.py's),
   its peak by `torch.cuda.max_memory_allocated` against the single-device prediction from the facts
   `measure_model` gives, without and with activation checkpointing, each within ±15% (issue 23's band).
6. With 2 GPUs or more: `model_parallel` meshes over NCCL: ep=2 (the expert mesh, `rt.expert_mesh`, its ep group
   all-reducing), cp=2 (context parallelism runs on CUDA only: `rt.mesh["dp_shard_cp"]` and its group), and tp=2
   with `tp_group_backend="gloo"` (the tp group over gloo inside the NCCL world); with cp=2, causal SDPA run as ring
   attention inside `rt.context_parallel` (allgather, and alltoall with head-tail balancing) equals the whole
   sequence's attention to 1e-3.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

Result = tuple[str, str, str]  # (check, outcome, detail)
KEYS = 1000


def _gpus() -> list[Any]:
    from trainplan.effects.nvml import default_nvml

    return list(default_nvml().gpus() or [])


def check_usable() -> list[Result]:
    import torch

    import trainplan as tp

    facts = _gpus()
    statuses = tp.gpu_statuses(timeout=60)
    usable = tp.find_usable_cuda_devices(timeout=60)
    from trainplan.effects.gpus import SubprocessProbeLauncher, probe_in_parallel

    # NVML decides a GPU in Default mode without a probe: run the probes on every GPU explicitly as well.
    probed = probe_in_parallel(list(range(len(statuses))), SubprocessProbeLauncher(), timeout=60)
    probes_ok = bool(probed) and all(outcome.state == "ok" for outcome in probed.values())
    fresh = not torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    detail = "; ".join(
        f"{status.index} {status.name}: {status.checked_by}, usable={status.usable}" for status in statuses
    )
    return [
        (
            "NVML facts (nvidia-ml-py)",
            "ok" if facts else "FAILED",
            f"{len(facts)} GPU(s): {', '.join(g.name for g in facts)}",
        ),
        (
            "gpu_statuses / find_usable_cuda_devices",
            "ok" if statuses and usable else "FAILED",
            f"usable {usable}; {detail}",
        ),
        (
            "a probe (a real allocation in a fresh child) on every GPU",
            "ok" if probes_ok else "FAILED",
            "; ".join(f"{index}: {outcome.state} {outcome.detail}".strip() for index, outcome in probed.items()),
        ),
        (
            "CUDA uninitialised in the caller afterwards",
            "ok" if fresh else "FAILED",
            f"torch.cuda.is_initialized()={not fresh}",
        ),
    ]


_HOLDER = (
    "import sys, time, torch\nx = torch.ones(1 << 20, device='cuda:0')\nprint('ready', flush=True)\ntime.sleep(60)\n"
)


def check_busy() -> list[Result]:
    import trainplan as tp

    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True, env=environment)
    try:
        assert holder.stdout is not None
        ready = holder.stdout.readline().strip() == "ready"
        facts = _gpus()[0]
        # In a container with its own PID namespace NVML reports the host's pids: any process listed will do.
        listed = facts.running_pids is None or holder.pid in facts.running_pids or bool(facts.running_pids)
        status = tp.gpu_statuses(timeout=60)[0]
        if facts.compute_mode == "exclusive_process":
            busy = not status.usable and str(holder.pid) in (status.reason or "")
            verdict = ("busy GPU reported busy (EXCLUSIVE_PROCESS)", "ok" if busy else "FAILED", str(status.reason))
        else:
            verdict = (
                f"busy GPU in {facts.compute_mode} mode stays usable",
                "ok" if status.usable else "FAILED",
                "the mode is never changed here; a shared GPU takes more processes",
            )
        return [
            (
                "a holder process listed by NVML on GPU 0",
                "ok" if ready and listed else "FAILED",
                f"pids {facts.running_pids}",
            ),
            verdict,
        ]
    finally:
        holder.kill()
        holder.wait(30)


class _StubWorld:
    world_size = 2
    rank = 0

    def all_reduce(self, tensor: Any, op: str) -> None:
        if op == "sum":
            tensor.mul_(2)

    def all_gather_object(self, value: object) -> list[object]:
        return [value, value]


def _best(function: Callable[[], object], repeats: int = 7) -> float:
    import torch

    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def check_metrics_on_cuda() -> list[Result]:
    import torch

    import trainplan as tp
    from trainplan.effects.metrics import MetricStore

    # A what-if world of 2 (its collective stubbed): this process is its rank 0, on cuda:0, under NCCL's placement.
    plan = tp.resolve(tp.Request(accelerator="cuda", strategy="ddp", devices=2), tp.Environment(cuda_device_count=2))
    moves: list[str] = []

    def transfer(tensor: Any, device: str) -> Any:
        moves.append(device)
        return tensor.to(device)

    store = MetricStore(plan, collective=_StubWorld(), transfer=transfer, local_rank=0)
    values = [torch.tensor(float(index), device="cuda:0") for index in range(KEYS)]
    for index, value in enumerate(values):
        store.log(f"k{index}", value, weight=2)
        store.log(f"cpu{index}", torch.tensor(float(index), device="cuda:0"), reduce="sum", store_on_cpu=True)
    computed = store.compute()
    first_moves = list(moves)
    right = all(
        computed[f"k{index}"] == float(index) and computed[f"cpu{index}"] == 2.0 * index for index in range(KEYS)
    )
    ours = _best(store.compute)
    names = [f"k{index}" for index in range(KEYS)]
    floor = _best(lambda: dict(sorted(zip(names, torch.stack(values).tolist(), strict=True))))
    per_key = _best(lambda: {name: value.item() for name, value in zip(names, values, strict=True)})
    return [
        (
            f"metric store on CUDA, {KEYS} device + {KEYS} CPU keys, synced (stubbed world of 2)",
            "ok" if right else "FAILED",
            f"moves in one compute (key check, then each CPU bucket there and back): {first_moves}",
        ),
        (
            f"synced compute() of {2 * KEYS} keys on CUDA",
            f"{ours * 1e3:.2f} ms",
            f"floor (stack, one tolist) {floor * 1e3:.2f} ms: {ours / floor:.2f}×; one .item() per key "
            f"{per_key * 1e3:.2f} ms: {per_key / ours:.1f}× slower than ours",
        ),
    ]


MEMORY_BAND = 0.15
"""Predicted / measured peak within ±15% (the processes tests' band, tests/processes/test_memory_world.py)."""


def check_memory_on_cuda() -> list[Result]:
    import torch
    from tests import llama_like
    from tests.scripts import memory_world

    import trainplan as tp
    from trainplan.resolve.memory import estimate
    from trainplan.rules.memory import MEMORY_LAYOUTS

    single = next(layout for layout in MEMORY_LAYOUTS if layout.name == "single_device")
    facts = tp.measure_model(llama_like.small, lambda: torch.randint(0, 8000, memory_world.BATCH))
    results: list[Result] = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        with torch.device("cuda:0"):
            model = llama_like.small(checkpointing)
            optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
            tokens = torch.randint(0, 8000, memory_world.BATCH)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(2):  # the second step holds the optimizer's states the first creates
            model(tokens).float().sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        del model, optimizer, tokens
        torch.cuda.empty_cache()
        predicted = estimate(single, checkpointing, facts, 1, 1).total
        ratio = predicted / peak
        results.append(
            (
                f"memory on cuda:0, 21M decoder{' + checkpointing' if checkpointing else ''}: predicted / peak",
                "ok" if abs(ratio - 1) <= MEMORY_BAND else "FAILED",
                f"{predicted / 2**20:.1f} MiB predicted, {peak / 2**20:.1f} MiB max_memory_allocated: {ratio:.3f}",
            )
        )
    return results


def _nccl_worker() -> dict[str, Any]:
    import torch

    import trainplan as tp

    store = tp.metric_store(tp.resolve())
    rank = torch.distributed.get_rank()
    store.log("device_sum", torch.tensor(float(rank + 1), device=f"cuda:{torch.cuda.current_device()}"), reduce="sum")
    store.log("cpu_sum", torch.tensor(float(rank + 1)), reduce="sum", store_on_cpu=True)
    store.log("number", rank + 1, reduce="max")
    return {"values": store.compute(), "backend": str(torch.distributed.get_backend())}


def check_nccl() -> list[Result]:
    import trainplan as tp

    count = len(_gpus())
    if count < 2:
        return [("2-GPU launch, metric sync over NCCL", "skipped", f"needs 2 GPUs; this machine has {count}")]
    plan = tp.resolve(tp.Request(accelerator="cuda", strategy="ddp_spawn", devices=2))
    reports = tp.launch_with(plan, _nccl_worker, timeout=240)
    expected = {"cpu_sum": 3.0, "device_sum": 3.0, "number": 2}
    right = all(report["values"] == expected and report["backend"] == "nccl" for report in reports)
    return [
        ("2-GPU launch, metric sync over NCCL (CPU-stored and device keys)", "ok" if right else "FAILED", str(reports))
    ]


def _mesh_worker() -> dict[str, Any]:
    import torch

    import trainplan as tp

    with tp.runtime() as rt:
        ep_group = rt.expert_mesh.get_group("ep")
        value = torch.tensor(float(rt.rank + 1), device=rt.device)
        torch.distributed.all_reduce(value, group=ep_group)
        layout = rt.plan.mesh
        assert layout is not None
        names = {"ep": list(torch.distributed.get_process_group_ranks(ep_group))}
        attention_error = None
        if layout.size("cp") > 1:
            names["dp_shard_cp"] = list(torch.distributed.get_process_group_ranks(rt.mesh["dp_shard_cp"].get_group()))
            attention_error = _ring_attention_error(rt)
        backends = {
            name: str(torch.distributed.get_backend(rt.mesh[name].get_group()))
            for name in layout.dimensions
            if layout.size(name) > 1
        }
        return {
            "sum": value.item(),
            "groups": names,
            "backend": str(torch.distributed.get_backend()),
            "group_backends": backends,
            "attention_error": attention_error,
        }


def _ring_attention_error(rt: Any) -> float:
    """Causal SDPA over a sequence split by `rt.context_parallel` (ring attention with the plan's rotate method and
    load balancer), gathered back: its largest difference from the whole sequence's attention on one rank."""
    import torch
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    from torch.nn import functional

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=generator).to(rt.device) for _ in range(3))
    whole = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    with rt.context_parallel([q, k, v], [2, 2, 2]):
        local = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        (gathered,) = context_parallel_unshard(rt.mesh["cp"], [local], [2])
    return float((gathered - whole).abs().max().item())


def check_meshes_on_nccl() -> list[Result]:
    import trainplan as tp

    count = len(_gpus())
    if count < 2:
        return [("model_parallel meshes over NCCL (ep=2, cp=2)", "skipped", f"needs 2 GPUs; this machine has {count}")]
    results: list[Result] = []
    for options, expected in (
        (tp.ModelParallelOptions(ep=2), {"ep": [0, 1]}),
        (tp.ModelParallelOptions(dp_shard=1, cp=2), {"ep": [0], "dp_shard_cp": [0, 1]}),
        # tp's groups over gloo inside the NCCL world (init_device_mesh's backend_override).
        (tp.ModelParallelOptions(dp_shard=1, tp=2, tp_group_backend="gloo"), {"ep": [0]}),
        # ring attention through rt.context_parallel with the non-default rotate method.
        (tp.ModelParallelOptions(dp_shard=1, cp=2, cp_rotate_method="alltoall"), {"ep": [0], "dp_shard_cp": [0, 1]}),
    ):
        request = tp.Request(accelerator="cuda", devices=2, strategy="model_parallel", strategy_options=options)
        plan = tp.resolve(request)
        assert plan.mesh is not None
        reports = tp.launch_with(plan, _mesh_worker, timeout=240)
        expected_by_rank = [
            {name: [rank] if members == [0] else members for name, members in expected.items()} for rank in range(2)
        ]
        mesh = plan.mesh
        backends = {name: mesh.backends.get(name, "nccl") for name in mesh.dimensions if mesh.size(name) > 1}
        right = all(
            report["groups"] == expected_by_rank[rank]
            and report["backend"] == "nccl"
            and report["group_backends"] == backends
            and (report["attention_error"] is None or report["attention_error"] < 1e-3)
            and report["sum"] == float(sum(member + 1 for member in expected_by_rank[rank]["ep"]))
            for rank, report in enumerate(reports)
        )
        results.append((f"model_parallel {options!r} over NCCL", "ok" if right else "FAILED", str(reports)))
    return results


def main() -> int:
    try:
        import torch  # noqa: F401  (the checks need it: a setup without it is broken, not GPU-less)

        import trainplan  # noqa: F401
        from trainplan.effects.nvml import default_nvml
    except ImportError as error:
        print(
            f"cannot run the GPU checks: {error}. Run `make test` (it creates .venv with the torch extra) or set "
            "PYTHON to an interpreter where trainplan[torch] is installed",
            file=sys.stderr,
        )
        return 2
    nvml = default_nvml()
    facts = nvml.gpus()  # None: NVML cannot answer here (no driver); any other failure is raised, not hidden
    if not facts:
        driver = getattr(nvml, "driver", None)
        reason = "NVML lists no GPU" if facts is not None else str(getattr(driver(), "reason", "")) if driver else ""
        print(f"no GPU: nothing to check here ({reason}). Run this on a machine with NVIDIA GPUs.")
        return 0
    results: list[Result] = []
    checks = (check_usable, check_busy, check_metrics_on_cuda, check_memory_on_cuda, check_nccl, check_meshes_on_nccl)
    for check in checks:
        try:
            results += check()
        except Exception as error:
            results.append((check.__name__, "FAILED", f"{type(error).__name__}: {error}"))
    print("| check | outcome | detail |\n|---|---|---|")
    for name, outcome, detail in results:
        print(f"| {name} | {outcome} | {detail} |")
    return 1 if any(outcome == "FAILED" for _, outcome, _ in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
