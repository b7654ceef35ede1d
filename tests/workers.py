"""Worker functions for the launch tests: importable, so every launcher can run them."""

from __future__ import annotations

import os
import signal
import time


def all_reduce_rank() -> tuple[int, int, float]:
    """(rank, world size, sum of ranks + 1 over the world), through a real collective."""
    import torch
    from torch import distributed

    value = torch.tensor([float(distributed.get_rank() + 1)])
    distributed.all_reduce(value)
    return distributed.get_rank(), distributed.get_world_size(), float(value.item())


def environment() -> dict[str, str]:
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {key: os.environ[key] for key in keys}


def my_plan() -> tuple[int | None, int | None, str]:
    import trainplan

    plan = trainplan.resolve()
    return plan.cluster.global_rank, plan.cluster.local_rank, plan.strategy.name


def plan_with_rules(rules: object) -> tuple[str | None, str, bool]:
    """What a spawned worker makes of the rule set it was handed (pickled): its reference, the plan it resolves on
    one NPU, and whether trainplan's own came back as itself."""
    import trainplan

    assert isinstance(rules, trainplan.Rules)
    plan = trainplan.resolve(trainplan.Request(), trainplan.Environment().with_device_counts({"npu": 1}), rules)
    return rules.reference, plan.accelerator, trainplan.BUILTIN_RULES is pickle_builtin_rules()


def pickle_builtin_rules() -> object:
    import pickle

    import trainplan

    return pickle.loads(pickle.dumps(trainplan.BUILTIN_RULES))


def add(left: int, right: int, *, scale: int = 1) -> int:
    return (left + right) * scale


def pid_then_sleep(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def fail_on_rank(rank: int) -> int:
    from torch import distributed

    if distributed.get_rank() == rank:
        raise ValueError(f"rank {rank} refuses")
    time.sleep(60)  # the siblings would wait forever; launch must stop them
    return 0


def exit_on_rank(rank: int, code: int) -> int:
    if int(os.environ["RANK"]) == rank:
        os._exit(code)
    time.sleep(60)
    return 0


def kill_on_rank(rank: int) -> int:
    if int(os.environ["RANK"]) == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
    return 0


def write_pid_and_hang(directory: str) -> int:
    with open(os.path.join(directory, f"{os.environ['RANK']}.pid"), "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(600)
    return 0


def unpicklable_result() -> object:
    return lambda: None


def fail_after_siblings_started(directory: str, rank: int) -> int:
    """Every rank records its pid; `rank` raises once all have, the others wait to be stopped."""
    with open(os.path.join(directory, f"{os.environ['RANK']}.pid"), "w") as handle:
        handle.write(str(os.getpid()))
    if int(os.environ["RANK"]) == rank:
        world = int(os.environ["WORLD_SIZE"])
        while len([name for name in os.listdir(directory) if name.endswith(".pid")]) < world:
            time.sleep(0.01)
        raise ValueError(f"rank {rank} refuses")
    time.sleep(600)
    return 0


def all_reduce_while_rank_1_sleeps(seconds: float) -> str:
    """Rank 0 waits in a collective that rank 1 reaches only after `seconds`: the group's timeout decides."""
    import torch
    from torch import distributed

    if distributed.get_rank() == 1:
        time.sleep(seconds)
        return "slept"
    distributed.all_reduce(torch.ones(1))
    return "reduced"


def launch_a_foreign_plan() -> str:
    """Inside a worker: try to start the workers of a plan resolved for another machine (launcher 'subprocess')."""
    import trainplan
    from trainplan.resolve import resolve

    plan = resolve(trainplan.Request(accelerator="cpu", devices=2), trainplan.Environment(cpu_count=2))
    try:
        trainplan.launch(plan, os.getpid)
    except trainplan.NestedLaunch as error:
        return f"NestedLaunch: {error}"
    return "started a second world"


def start_a_sleeper() -> int:
    """Start a grandchild that would outlive its worker, and return its pid."""
    import subprocess

    return subprocess.Popen(["sleep", "300"]).pid


def return_then_linger() -> str:
    """Return at once, but keep the interpreter alive with a non-daemon thread."""
    import threading

    threading.Thread(target=time.sleep, args=(600,), daemon=False).start()
    return "done"


def _refuse_to_load() -> object:
    raise RuntimeError("this result cannot be rebuilt in the caller")


class Unloadable:
    """Pickles in the worker; unpickling it in the caller raises."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_refuse_to_load, ())


def return_unloadable() -> Unloadable:
    return Unloadable()


def listening_addresses() -> list[str]:
    """The local addresses of every socket listening on MASTER_PORT, from /proc (nothing is connected)."""
    port = int(os.environ["MASTER_PORT"])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                address, port_hex = fields[1].rsplit(":", 1)
                if fields[3] == "0A" and int(port_hex, 16) == port:
                    found.append(address)
    return found


def sigterm_handler_is_default() -> bool:
    return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def launch_the_same_request_inside() -> list[int]:
    """Inside a worker: resolve the launcher's own request again and launch it: it must run here, in place."""
    import trainplan

    plan = trainplan.resolve(trainplan.Request(accelerator="cpu", strategy="ddp_spawn", devices=2))
    return trainplan.launch(plan, os.getpid)


def _exit_seven() -> object:
    raise SystemExit(7)


class ExitsWhenLoaded:
    """Pickles in the worker; unpickling it in the caller calls sys.exit."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_exit_seven, ())


def return_exits_when_loaded() -> ExitsWhenLoaded:
    return ExitsWhenLoaded()


class RefusesToPickle:
    def __reduce__(self) -> tuple[object, ...]:
        raise ValueError("no pickling for me")


CALLER_STATE = "as imported"
"""A module global the caller changes before launching: a spawn-class worker must see it as imported."""


def how_i_was_started(variable: str) -> dict[str, object]:
    """What a spawn-class worker sees of its start: its parent, CUDA, the caller's state and environment."""
    import sys

    import torch

    return {
        "parent": os.getppid(),
        "cuda_initialised": torch.cuda.is_initialized(),  # type: ignore[no-untyped-call]
        "caller_state": CALLER_STATE,
        "variable": os.environ.get(variable),
        "main_module": sys.modules["__main__"].__name__,
        "rank": os.environ["RANK"],
    }


def large_tensor_operations() -> float:
    """Operations large enough to run in torch's thread pool (they hang in a forked child of a parent that used
    the pool, unless the child runs them on one thread)."""
    import torch

    joined = torch.cat([torch.ones(200_000), torch.ones(200_000)])
    return float(joined.sum().item() + torch.tensor([1.0, 2.0]).repeat_interleave(torch.tensor([2, 3])).sum().item())


def torch_threads() -> tuple[str | None, int]:
    import torch

    return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()
