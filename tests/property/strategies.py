"""Hypothesis strategies shared by the property tests: requests and environments over the whole space.

Requests mix valid names, near-misses, aliases and values of the wrong type; environments mix
hardware, sessions, start methods, packages and cluster variables (some of them corrupted).
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import strategies as st

from tests.helpers import LAUNCHED_1_OF_2
from trainplan import DDPOptions, DeepSpeedOptions, Environment, FSDPOptions, ModelParallelOptions, Request, Rules
from trainplan.spec.names import (
    ACCELERATOR_FLAGS,
    BACKENDS,
    CLUSTER_FLAGS,
    METRICS_STORES,
    PRECISION_FLAGS,
    START_METHODS,
    STRATEGY_FLAGS,
)

garbage: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True),
    st.integers(min_value=-3, max_value=10),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-2, max_value=9), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def names(valid: tuple[object, ...], extra: tuple[object, ...] = (), *, wild: bool) -> st.SearchStrategy[Any]:
    """Valid names (sometimes upper-cased); with `wild`, also aliases, near-misses and garbage."""
    text_valid = [name for name in valid if isinstance(name, str)]
    tame = st.one_of(
        st.sampled_from(valid),
        st.sampled_from(valid),
        st.sampled_from(text_valid).map(str.upper) if text_valid else st.nothing(),
    )
    if not wild:
        return tame
    return st.one_of(tame, st.sampled_from(extra) if extra else st.nothing(), garbage)


def devices(*, wild: bool) -> st.SearchStrategy[Any]:
    tame = st.one_of(
        st.just("auto"),
        st.integers(min_value=1, max_value=4),
        st.just(-1),
        st.sampled_from(["-1", "1", "2", "0,1", "1,", "0,2"]),
        st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=3, unique=True),
    )
    if not wild:
        return tame
    return st.one_of(
        tame,
        st.integers(min_value=-2, max_value=9),
        st.sampled_from(["7", "a", "", "0,0", "0", "-3"]),
        st.lists(st.integers(min_value=-1, max_value=9), max_size=4),
        garbage,
    )


def options(*, wild: bool) -> st.SearchStrategy[Any]:
    tame = st.one_of(
        st.none(),
        st.none(),
        st.builds(DDPOptions, find_unused_parameters=st.booleans(), static_graph=st.booleans()),
        st.builds(FSDPOptions, cpu_offload=st.booleans()),
        st.builds(
            DeepSpeedOptions,
            stage=st.sampled_from([0, 1, 2, 3]),
            offload_optimizer=st.booleans(),
            offload_parameters=st.booleans(),
        ),
        st.builds(
            ModelParallelOptions,
            pp=st.sampled_from([1, 1, 2]),
            tp=st.sampled_from([1, 2, 4, "auto"]),
            cp=st.sampled_from([1, 1, 2]),
        ),
        st.builds(ModelParallelOptions, data_parallel_size=st.sampled_from([1, 2, "auto"])),
    )
    return st.one_of(tame, garbage) if wild else tame


def _mostly(default: object, strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The default half of the time, so that plans (not only errors) are well covered."""
    return st.one_of(st.just(default), strategy)


def _requests(*, wild: bool) -> st.SearchStrategy[Request]:
    return st.builds(
        Request,
        accelerator=_mostly("auto", names(ACCELERATOR_FLAGS, ("gpux", "tpus"), wild=wild)),
        strategy=_mostly("auto", names(STRATEGY_FLAGS, ("ddp_spwn", "horovod"), wild=wild)),
        devices=devices(wild=wild),
        num_nodes=st.one_of(st.just(1), st.integers(min_value=1, max_value=3), *([garbage] if wild else [])),
        precision=_mostly("32-true", names(PRECISION_FLAGS, ("fp16", "8", 8), wild=wild)),
        process_group_backend=_mostly(None, names(BACKENDS, ("ncl",), wild=wild)),
        cluster=_mostly("auto", _mostly("auto", names(CLUSTER_FLAGS, ("sge",), wild=wild))),
        metrics_store=names(METRICS_STORES, ("gpu",), wild=wild),
        sync_batchnorm=st.one_of(st.booleans(), *([garbage] if wild else [])),
        strategy_options=_mostly(None, options(wild=wild)),
    )


requests: st.SearchStrategy[Request] = st.one_of(_requests(wild=False), _requests(wild=False), _requests(wild=True))
"""Requests over the whole space: mostly well-typed (spelling varies), a third with wrong types and garbage."""

_SLURM = {
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_NNODES": "2",
    "SLURM_PROCID": "3",
    "SLURM_STEP_ID": "0",  # an srun task (the batch script and salloc's shell have none)
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NAME": "train",
    "SLURM_JOB_ID": "778899",
    "SLURM_NODELIST": "gpu[01-02]",
}
_TORCHRUN = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "GROUP_RANK": "0",
    "LOCAL_WORLD_SIZE": "2",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}
_LSF = {
    "LSB_JOBID": "55",
    "JSM_NAMESPACE_SIZE": "2",
    "JSM_NAMESPACE_RANK": "0",
    "JSM_NAMESPACE_LOCAL_RANK": "0",
    "LSB_MCPU_HOSTS": "batch 1 c1 4",
}
_MPI = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
_LOCAL = {"NODE_RANK": "1", "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "1234"}
_KUBEFLOW = {
    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    "MASTER_ADDR": "train-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "3",
    "RANK": "2",
}
"""One pod of a Kubeflow PyTorchJob (one process per pod)."""


@st.composite
def variables(draw: st.DrawFn) -> dict[str, str]:
    """No variables, or a cluster's, sometimes with one value corrupted."""
    base = dict(
        draw(
            st.sampled_from(
                [
                    {},
                    {},
                    {},
                    _SLURM,
                    _TORCHRUN,
                    _LSF,
                    _MPI,
                    _LOCAL,
                    _KUBEFLOW,
                    LAUNCHED_1_OF_2,
                    {**_SLURM, "SLURM_JOB_NAME": "bash"},
                ]
            )
        )
    )
    if base and draw(st.integers(min_value=0, max_value=3)) == 0:
        key = draw(st.sampled_from(sorted(base)))
        base[key] = draw(st.sampled_from(["", "x", "-1", "99999", "0", "5", "n[1-"]))
    if draw(st.booleans()):
        base["CUDA_VISIBLE_DEVICES"] = draw(st.sampled_from(["", "0", "0,1"]))
    return base


environments: st.SearchStrategy[Environment] = st.builds(
    Environment,
    cuda_device_count=st.sampled_from([0, 0, 1, 2, 4, 8]),
    cuda_initialized=st.booleans(),
    mps_available=st.booleans(),
    xla_device_count=st.sampled_from([0, 0, 0, 1, 4, 8]),
    cpu_count=st.integers(min_value=1, max_value=16),
    interactive=st.booleans(),
    start_methods=st.lists(st.sampled_from(START_METHODS), unique=True, min_size=1).map(tuple),
    packages=st.sets(st.sampled_from(["deepspeed", "transformer_engine", "torch_xla", "torchmetrics"])),
    variables=variables(),
)
"""Environments over the hardware, session, platform, package and cluster space."""


@st.composite
def plausible_pairs(draw: st.DrawFn) -> tuple[Request, Environment]:
    """A request written for its environment: available accelerators, fitting device counts, auto cluster."""
    env = draw(environments)
    if env.cuda_device_count and draw(st.booleans()):
        usable = draw(st.lists(st.integers(0, env.cuda_device_count - 1), unique=True).map(sorted).map(tuple))
        env = attrs.evolve(env, usable_cuda_devices=usable)
    available = ["auto", "cpu"]
    if env.cuda_device_count:
        available += ["cuda", "gpu"]
    if env.mps_available:
        available += ["mps"]
    if env.xla_device_count:
        available += ["xla", "tpu"]
    count = max(env.cuda_device_count, env.xla_device_count, 2)
    request = Request(
        accelerator=draw(st.sampled_from(available)),
        strategy=draw(st.one_of(st.just("auto"), st.sampled_from(STRATEGY_FLAGS))),
        devices=draw(
            st.one_of(
                st.just("auto"),
                st.integers(min_value=1, max_value=count),
                st.lists(st.integers(min_value=0, max_value=count - 1), min_size=1, max_size=3, unique=True),
            )
        ),
        num_nodes=draw(st.sampled_from([1, 1, 2])),
        precision=draw(st.sampled_from(PRECISION_FLAGS)),
        process_group_backend=draw(st.one_of(st.none(), st.sampled_from(BACKENDS))),
        metrics_store=draw(st.sampled_from(METRICS_STORES)),
        sync_batchnorm=draw(st.booleans()),
        strategy_options=draw(st.one_of(st.none(), options(wild=False))),
        select_usable_gpus=draw(st.sampled_from([False, False, True])),
    )
    return request, env


pairs: st.SearchStrategy[tuple[Request, Environment]] = st.one_of(
    plausible_pairs(), plausible_pairs(), st.tuples(requests, environments)
)
"""(request, environment) pairs: two thirds written for their environment, one third drawn independently."""


def pairs_for(rules: Rules) -> st.SearchStrategy[tuple[Request, Environment]]:
    """`pairs`, with names a downstream rule set adds beyond the built-in ones sometimes drawn: its strategies,
    accelerators (their devices counted in `Environment.device_counts`, sometimes wrongly), precisions and
    backends."""
    custom = sorted(name for name in rules.strategies if name not in STRATEGY_FLAGS)
    accelerators = sorted(name for name in rules.accelerators if name not in ACCELERATOR_FLAGS)
    precisions = sorted(name for name in rules.precisions if name not in PRECISION_FLAGS)
    backends = sorted(name for name in rules.backends if name not in BACKENDS)
    if not (custom or accelerators or precisions or backends):
        return pairs

    @st.composite
    def on_downstream_hardware(draw: st.DrawFn) -> tuple[Request, Environment]:
        """A request written for a downstream accelerator that the environment counts."""
        request, env = draw(plausible_pairs())
        accelerator = draw(st.sampled_from(accelerators))
        count = draw(st.integers(min_value=1, max_value=8))
        runs_there = sorted(name for name, rule in rules.precisions.items() if accelerator in rule.accelerators)
        strategies = sorted(
            name for name, rule in rules.strategies.items() if accelerator in rules.families[rule.family].accelerators
        )
        request = attrs.evolve(
            request,
            accelerator=draw(st.sampled_from([accelerator, "auto"])),
            strategy=draw(st.sampled_from(["auto", *strategies])),
            devices=draw(st.one_of(st.just("auto"), st.integers(min_value=1, max_value=count))),
            precision=draw(st.sampled_from(runs_there)),
            process_group_backend=draw(st.sampled_from([None, rules.accelerators[accelerator].default_backend])),
            strategy_options=None,
            select_usable_gpus=False,
            sync_batchnorm=False,
        )
        packages = {*env.packages, *(rule.requires_package or "" for rule in rules.precisions.values())} - {""}
        return request, attrs.evolve(env, packages=packages).with_device_counts({accelerator: count})

    @st.composite
    def downstream(draw: st.DrawFn) -> tuple[Request, Environment]:
        request, env = draw(pairs)
        changes: dict[str, Any] = {}
        if draw(st.booleans()) and custom:
            changes["strategy"] = draw(st.sampled_from(custom))
        if draw(st.booleans()) and accelerators:
            changes["accelerator"] = _spelled(draw, draw(st.sampled_from(accelerators)))
        if draw(st.booleans()) and precisions:
            changes["precision"] = _spelled(draw, draw(st.sampled_from(precisions)))
        if draw(st.booleans()) and backends:
            changes["process_group_backend"] = draw(st.sampled_from(backends))
        if draw(st.booleans()) and accelerators:
            counts = st.integers(min_value=0, max_value=8)
            wrong = st.one_of(st.just(-1), st.just(True), st.just("4"), st.just(1 << 13))
            env = env.with_device_counts(
                draw(
                    st.dictionaries(
                        st.sampled_from([*accelerators, "unlisted"]),
                        st.one_of(counts, counts, counts, wrong),
                        max_size=2,
                    )
                )
            )
        if draw(st.booleans()):
            packages = {*env.packages, *(rule.requires_package or "" for rule in rules.precisions.values())} - {""}
            env = attrs.evolve(env, packages=packages)
        return attrs.evolve(request, **changes), env

    if not accelerators:
        return st.one_of(pairs, downstream())
    return st.one_of(pairs, downstream(), on_downstream_hardware())


def _spelled(draw: st.DrawFn, name: str) -> str:
    """A name as written, or upper-cased (the normaliser folds case)."""
    return name.upper() if draw(st.integers(min_value=0, max_value=3)) == 0 else name
