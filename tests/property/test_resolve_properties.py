"""Properties of resolve over the whole combination space of requests × environments."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings

from tests.property.strategies import pairs
from trainplan import Environment, Plan, Request, TrainplanError
from trainplan.resolve import check, resolve
from trainplan.spec.plan import plan_from_json_text
from trainplan.spec.tables import ACCELERATORS, FAMILIES, LAUNCHERS, PRECISIONS, STRATEGIES

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def resolve_or_error(request: Request, env: Environment) -> Plan | TrainplanError:
    try:
        return resolve(request, env)
    except TrainplanError as error:
        return error


class TestTotality:
    """resolve returns a Plan or raises a TrainplanError, nothing else, for any input (wrong types too)."""

    @SETTINGS
    @given(pairs)
    def test_plan_or_typed_error(self, pair: tuple[Request, Environment]) -> None:
        request, env = pair
        outcome = resolve_or_error(request, env)
        assert isinstance(outcome, (Plan, TrainplanError))
        if isinstance(outcome, TrainplanError):
            assert str(outcome).strip(), "every error has a message"

    @SETTINGS
    @given(pairs)
    def test_check_agrees_with_resolve(self, pair: tuple[Request, Environment]) -> None:
        request, env = pair
        outcome = resolve_or_error(request, env)
        problems = list(check(request, env))
        if isinstance(outcome, Plan):
            assert problems == []
        else:
            assert problems, "check finds what resolve raised"
            assert type(problems[0]) is type(outcome) and str(problems[0]) == str(outcome)


class TestInvariants:
    """A plan is internally consistent and consistent with the rule tables and the environment."""

    @SETTINGS
    @given(pairs)
    def test_plan_invariants(self, pair: tuple[Request, Environment]) -> None:
        request, env = pair
        plan = resolve_or_error(request, env)
        if not isinstance(plan, Plan):
            return
        rule = STRATEGIES[plan.strategy.name]
        family = FAMILIES[rule.family]
        assert plan.world_size == plan.num_nodes * plan.processes_per_node
        assert len(set(plan.devices)) == len(plan.devices) >= 1
        assert plan.processes_per_node == (len(plan.devices) if family.multi_process else 1)
        if plan.accelerator == "cuda":
            assert all(0 <= index < env.cuda_device_count for index in plan.devices)
        if plan.request.select_usable_gpus:
            assert env.usable_cuda_devices is not None and set(plan.devices) <= set(env.usable_cuda_devices)
        if plan.accelerator == "xla":
            assert all(0 <= index < env.xla_device_count for index in plan.devices)
        if plan.accelerator == "mps":
            assert plan.devices == (0,) and env.mps_available
        assert plan.accelerator in family.accelerators
        assert plan.strategy.family == rule.family
        assert plan.launcher == rule.launcher or (plan.launcher == "external" and plan.cluster.creates_processes)
        if env.interactive:
            assert LAUNCHERS[plan.launcher].interactive_compatible
        assert (plan.process_group_backend is None) == (not family.has_process_group)
        assert plan.precision in family.precisions and plan.accelerator in PRECISIONS[plan.precision].accelerators
        if plan.process_group_backend is None:
            assert plan.metrics.reduces_on == "nowhere"
        assert 0 <= plan.cluster.node_rank < plan.num_nodes
        if plan.cluster.global_rank is not None:
            assert 0 <= plan.cluster.global_rank < plan.world_size
        if plan.cluster.local_rank is not None:
            assert 0 <= plan.cluster.local_rank < plan.processes_per_node
        assert plan.metrics.device_type == ACCELERATORS[plan.accelerator].device_type
        assert len(plan.device_strings) == plan.processes_per_node


class TestDeterminismAndRoundTrips:
    @SETTINGS
    @given(pairs)
    def test_same_inputs_same_outcome(self, pair: tuple[Request, Environment]) -> None:
        request, env = pair
        first, second = resolve_or_error(request, env), resolve_or_error(request, env)
        if isinstance(first, Plan):
            assert first == second
        else:
            assert type(first) is type(second) and str(first) == str(second)

    @SETTINGS
    @given(pairs)
    def test_resolving_the_plans_request_gives_the_same_plan(self, pair: tuple[Request, Environment]) -> None:
        request, env = pair
        plan = resolve_or_error(request, env)
        if isinstance(plan, Plan):
            assert resolve(plan.request, env) == plan

    @SETTINGS
    @given(pairs)
    def test_json_round_trip(self, pair: tuple[Request, Environment]) -> None:
        request, env = pair
        plan = resolve_or_error(request, env)
        if isinstance(plan, Plan):
            assert plan_from_json_text(json.dumps(plan.to_dict())) == plan
