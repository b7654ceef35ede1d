"""Properties of resolve over the whole combination space of requests × environments, for trainplan's own rule
set and for a downstream framework's extension of it (`tests.downstream_rules`): every property holds for both."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.downstream_rules import RULES as DOWNSTREAM_RULES
from tests.property.strategies import pairs_for
from trainplan import BUILTIN_RULES, Environment, Plan, Request, Rules, TrainplanError
from trainplan.parse.plan_json import plan_from_json_text
from trainplan.resolve import check, resolve, resolve_uncached

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

RULE_SETS = pytest.mark.parametrize("rules", [BUILTIN_RULES, DOWNSTREAM_RULES], ids=["builtin", "downstream"])


def resolve_or_error(request: Request, env: Environment, rules: Rules) -> Plan | TrainplanError:
    try:
        return resolve(request, env, rules)
    except TrainplanError as error:
        return error


def uncached_or_error(request: Request, env: Environment, rules: Rules) -> Plan | TrainplanError:
    try:
        return resolve_uncached(request, env, rules)
    except TrainplanError as error:
        return error


@RULE_SETS
class TestTotality:
    """resolve returns a Plan or raises a TrainplanError, nothing else, for any input (wrong types too)."""

    @SETTINGS
    @given(data=st.data())
    def test_plan_or_typed_error(self, rules: Rules, data: st.DataObject) -> None:
        request, env = data.draw(pairs_for(rules))
        # Any other exception escapes resolve_uncached and fails the test: that is the property.
        outcome = uncached_or_error(request, env, rules)
        if isinstance(outcome, TrainplanError):
            assert str(outcome).strip(), "every error has a message"
        else:
            assert type(outcome) is Plan

    @SETTINGS
    @given(data=st.data())
    def test_check_agrees_with_resolve(self, rules: Rules, data: st.DataObject) -> None:
        request, env = data.draw(pairs_for(rules))
        outcome = resolve_or_error(request, env, rules)
        problems = list(check(request, env, rules))
        if isinstance(outcome, Plan):
            assert problems == []
        else:
            assert problems, "check finds what resolve raised"
            assert type(problems[0]) is type(outcome) and str(problems[0]) == str(outcome)


@RULE_SETS
class TestInvariants:
    """A plan is internally consistent and consistent with the rule tables and the environment."""

    @SETTINGS
    @given(data=st.data())
    def test_plan_invariants(self, rules: Rules, data: st.DataObject) -> None:
        request, env = data.draw(pairs_for(rules))
        plan = resolve_or_error(request, env, rules)
        if not isinstance(plan, Plan):
            return
        rule = rules.strategies[plan.strategy.name]
        family = rules.families[rule.family]
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
        if rules.accelerators[plan.accelerator].count_fact == "device_counts":  # a downstream accelerator's
            assert all(0 <= index < env.device_counts[plan.accelerator] for index in plan.devices)
            assert plan.device_strings == tuple(f"{plan.accelerator}:{index}" for index in plan.devices)
        assert plan.process_group_backend is None or plan.process_group_backend in rules.backends
        assert plan.precision in rules.precision_recipes
        assert plan.accelerator in family.accelerators
        assert plan.strategy.family == rule.family
        assert plan.launcher == rule.launcher or (plan.launcher == "external" and plan.cluster.creates_processes)
        if env.interactive:
            assert rules.launchers[plan.launcher].interactive_compatible
        assert (plan.process_group_backend is None) == (not family.has_process_group)
        assert plan.precision in family.precisions and plan.accelerator in rules.precisions[plan.precision].accelerators
        if plan.process_group_backend is None:
            assert plan.metrics.reduces_on == "nowhere"
        if plan.cluster.node_rank is None:  # only inside a job that states none (MPI)
            assert plan.cluster.creates_processes
        else:
            assert 0 <= plan.cluster.node_rank < plan.num_nodes
        if plan.cluster.global_rank is not None:
            assert 0 <= plan.cluster.global_rank < plan.world_size
        if plan.cluster.local_rank is not None:
            assert 0 <= plan.cluster.local_rank < plan.processes_per_node
        assert plan.metrics.device_type == rules.accelerators[plan.accelerator].device_type
        assert len(plan.device_strings) == plan.processes_per_node


@RULE_SETS
class TestDeterminismAndRoundTrips:
    @SETTINGS
    @given(data=st.data())
    def test_same_inputs_same_outcome(self, rules: Rules, data: st.DataObject) -> None:
        """Two cold runs (no memo) agree, on equal copies of the inputs, and the memoised plan equals them."""
        request, env = data.draw(pairs_for(rules))
        first = uncached_or_error(request, env, rules)
        second = uncached_or_error(attrs.evolve(request), attrs.evolve(env), rules)
        if isinstance(first, Plan):
            assert first is not second and first == second and hash(first) == hash(second)
            assert resolve_or_error(request, env, rules) == first
        else:
            assert type(first) is type(second) and str(first) == str(second)

    @SETTINGS
    @given(data=st.data())
    def test_resolving_the_plans_request_gives_the_same_plan(self, rules: Rules, data: st.DataObject) -> None:
        request, env = data.draw(pairs_for(rules))
        plan = resolve_or_error(request, env, rules)
        if isinstance(plan, Plan):
            assert resolve_uncached(plan.request, env, rules) == plan

    @SETTINGS
    @given(data=st.data())
    def test_json_round_trip(self, rules: Rules, data: st.DataObject) -> None:
        request, env = data.draw(pairs_for(rules))
        plan = resolve_or_error(request, env, rules)
        if isinstance(plan, Plan):
            assert plan_from_json_text(json.dumps(plan.to_dict())) == plan
