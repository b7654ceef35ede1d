"""Properties of the memory-aware choice over model facts × hardware × policy × installed packages.

Rule: with the model's facts and the devices' memory, `strategy='auto'` takes the first candidate of the rule set's
order that the rules allow and that fits by the formula the plan displays; no allowed candidate preferred to it fits;
and when nothing fits, the refusal is typed and every allowed candidate is over the budget (or the host's memory).
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import trainplan as tp
from tests.helpers import ways_out
from trainplan.resolve import resolve_uncached
from trainplan.resolve.memory import Hardware, candidates

GIB = 1 << 30


@st.composite
def _facts(draw: st.DrawFn) -> tp.ModelFacts:
    return tp.transformer_facts(
        parameters=10 ** draw(st.floats(6, 11.3)),  # log-uniform: 1M to 200B
        layers=draw(st.integers(1, 96)),
        hidden=draw(st.sampled_from([256, 1024, 4096, 8192])),
        sequence=draw(st.sampled_from([128, 2048, 8192])),
        batch_size=draw(st.integers(1, 8)),
    )


REQUESTS = st.builds(
    lambda facts, nodes, policy: tp.Request(model=facts, num_nodes=nodes, precision="bf16-mixed", memory_policy=policy),
    _facts(),
    st.sampled_from([1, 2, 4]),
    st.builds(
        tp.MemoryPolicy,
        headroom=st.sampled_from([0.0, 0.1, 0.3]),
        activation_checkpointing=st.booleans(),
        offload=st.booleans(),
    ),
)
ENVIRONMENTS = st.builds(
    lambda count, size, host, packages: tp.Environment(
        cuda_device_count=count,
        cuda_memory_bytes=(size * GIB,) * count,
        host_memory_bytes=host,
        packages=packages,
        variables={"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "0"},
    ),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([16, 24, 40, 80]),
    st.sampled_from([None, 64 * GIB, 2048 * GIB]),
    st.sampled_from([frozenset(), frozenset({"deepspeed"})]),
)


class TestTheChoiceIsTheFirstThatFits:
    """The chosen candidate fits by the displayed formula, and no preferred allowed candidate does."""

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(REQUESTS, ENVIRONMENTS)
    def test_the_choice_fits_and_nothing_preferred_does(self, request: tp.Request, env: tp.Environment) -> None:
        try:
            plan = resolve_uncached(request, env)
        except tp.Incompatible as refused:
            assert refused.rule == "memory-nothing-fits", refused
            event("nothing fits")
            hardware = Hardware(
                num_nodes=request.num_nodes if isinstance(request.num_nodes, int) else 1,
                processes_per_node=env.cuda_device_count,
                device_bytes=env.cuda_memory_bytes[0],
                host_bytes=env.host_memory_bytes,
                accelerator="cuda",
                precision="bf16-mixed",
                packages=env.packages,
            )
            policy = request.memory_policy or tp.BUILTIN_RULES.memory_policy
            assert request.model is not None
            assert not any(item.fits for item in candidates(request.model, hardware, policy, tp.BUILTIN_RULES))
            return
        memory = plan.memory
        assert memory is not None and memory.chosen is not None
        event(f"chose {memory.chosen}")
        order = list(memory.candidates)
        chosen = next(index for index, item in enumerate(order) if item.verdict == "chosen")
        assert order[chosen].total <= memory.budget_bytes  # the displayed formula, re-added here
        states = order[chosen].parameters + order[chosen].gradients + order[chosen].optimizer
        extra = max(order[chosen].activations + order[chosen].gathered + order[chosen].temporaries, order[chosen].step)
        assert states + extra == order[chosen].total
        for item in order[:chosen]:
            assert not item.fits
            assert item.verdict.startswith(("not allowed", "needs", "host memory"))
        assert plan.strategy.name == order[chosen].strategy


class TestEveryWayOutFits:
    """When nothing fits, each change the refusal's "To fit it" names (more nodes, more devices a node, host memory,
    device memory, a smaller model), followed by its numbers, resolves to a plan that fits."""

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(REQUESTS, ENVIRONMENTS)
    def test_following_the_advice_fits(self, request: tp.Request, env: tp.Environment) -> None:
        try:
            resolve_uncached(request, env)
        except tp.Incompatible as refused:
            found = ways_out(str(refused), request, env)
            assert found, str(refused)
            for kind, (changed, node) in found.items():
                event(f"way out: {kind}")
                plan = resolve_uncached(changed, node)
                assert plan.memory is not None and plan.memory.estimate is not None, (kind, str(refused))
