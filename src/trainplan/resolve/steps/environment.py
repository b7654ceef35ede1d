"""Steps 1 and 2: the arguments are a `Request`, an `Environment` and a `Rules`, and each fact of the environment
has its type and range. Nothing goes on past a wrong one (the later steps read them all)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from trainplan.parse.memory import MAX_BYTES
from trainplan.resolve.draft import Draft
from trainplan.rules import MAX_CPU_COUNT, MAX_DEVICES_PER_NODE, SUPPLIED_COUNTS, Rules
from trainplan.spec.environment import Environment
from trainplan.spec.errors import InvalidRequest, a_kind
from trainplan.spec.frozen import all_strings
from trainplan.spec.names import START_METHODS
from trainplan.spec.request import Request

_ARGUMENTS: tuple[tuple[str, type, str, str], ...] = (
    ("request", Request, "Request", "Build one with Request(...) or Request.from_config({...})"),
    ("env", Environment, "Environment", "Use trainplan.probe() for this machine, or Environment(...) for a what-if"),
    (
        "rules",
        Rules,
        "Rules",
        "Pass trainplan.BUILTIN_RULES (the default) or a rule set built with BUILTIN_RULES.extend(...)",
    ),
)
"""Each argument of `resolve`: its name, its type, and how to make one."""

_LIMITS = (
    ("cuda_device_count", 0, MAX_DEVICES_PER_NODE),
    ("xla_device_count", 0, MAX_DEVICES_PER_NODE),
    ("cpu_count", 1, MAX_CPU_COUNT),
)
_SWITCHES = ("cuda_initialized", "mps_available", "interactive")


def check_arguments(draft: Draft) -> None:
    """Refuses an argument of the wrong type (the first one)."""
    given: tuple[object, ...] = (draft.request, draft.env, draft.rules)
    for value, (field, kind, name, fix) in zip(given, _ARGUMENTS, strict=True):
        if not isinstance(value, kind):
            raise InvalidRequest(
                field=field,
                value=value,
                reason=f"resolve takes a trainplan.{name}, not {a_kind(value)}",
                fix=fix,
            )


def check_facts(draft: Draft) -> None:
    """Refuses every fact of the wrong type or out of range; the run ends after them."""
    for problem in environment_problems(draft.env, draft.rules):
        draft.refuse(problem)
        draft.end()


def environment_problems(env: Environment, rules: Rules) -> Iterator[InvalidRequest]:
    """Each fact checked on its own (the record's types say what each fact is; values written by hand at runtime may
    still be anything)."""
    for field, minimum, maximum in _LIMITS:
        value = getattr(env, field)
        if type(value) is not int or not minimum <= value <= maximum:
            yield _bad(field, value, f"it must be a whole number from {minimum} to {maximum}")
    for field in _SWITCHES:
        if type(getattr(env, field)) is not bool:
            yield _bad(field, getattr(env, field), "it must be True or False")
    methods: object = env.start_methods
    if not isinstance(methods, tuple) or not all(map(START_METHODS.__contains__, methods)):
        yield _bad("start_methods", methods, f"start methods are among {START_METHODS}")
    packages: object = env.packages
    if not isinstance(packages, frozenset) or not all_strings(packages):
        yield _bad("packages", packages, "packages is a set of package names, e.g. {'deepspeed'}")
    variables: object = env.variables
    if not isinstance(variables, Mapping) or not (all_strings(variables) and all_strings(variables.values())):
        yield _bad("variables", variables, "environment variables map strings to strings")
    counts: object = env.device_counts
    if not isinstance(counts, Mapping) or counts:
        yield from _count_problems(counts, rules)
    yield from _memory_problems(env)
    usable: object = env.usable_cuda_devices
    count: object = env.cuda_device_count
    if usable is not None and isinstance(count, int) and not _distinct_indices(usable, count):
        yield _bad("usable_cuda_devices", usable, "usable devices are distinct visible CUDA indices")


def _memory_problems(env: Environment) -> Iterator[InvalidRequest]:
    """Device and host memory: byte counts above zero (one per visible CUDA device, when given)."""
    memory: object = env.cuda_memory_bytes
    count: object = env.cuda_device_count
    if not isinstance(memory, tuple) or not all(type(item) is int and 0 < item <= MAX_BYTES for item in memory):
        yield _bad("cuda_memory_bytes", memory, "it holds each visible CUDA device's memory in bytes, e.g. (40 << 30,)")
    elif memory and memory.__len__() != count:
        yield _bad(
            "cuda_memory_bytes",
            memory,
            f"it holds one figure per visible CUDA device, and cuda_device_count={count!r}",
        )
    host: object = env.host_memory_bytes
    if host is not None and (type(host) is not int or not 0 < host <= MAX_BYTES):
        yield _bad("host_memory_bytes", host, "it is this machine's memory in bytes, or None when not known")


def _bad(field: str, value: object, reason: str) -> InvalidRequest:
    return InvalidRequest(
        field=f"Environment.{field}",
        value=value,
        reason=reason,
        fix="Fix the environment facts (or let trainplan.probe() gather them)",
    )


def _distinct_indices(usable: object, count: int) -> bool:
    return (
        isinstance(usable, tuple)
        and all(isinstance(index, int) and not isinstance(index, bool) and 0 <= index < count for index in usable)
        and len(set(usable)) == len(usable)
    )


def _count_problems(counts: object, rules: Rules) -> Iterator[InvalidRequest]:
    """`device_counts` (unless empty): downstream accelerators' device counts, each an accelerator the rule set counts
    that way."""
    if not isinstance(counts, Mapping) or not all(
        isinstance(name, str) and type(number) is int and 0 <= number <= MAX_DEVICES_PER_NODE
        for name, number in counts.items()
    ):
        yield _bad(
            "device_counts",
            counts,
            f"it maps a downstream accelerator's name to its visible devices (0 to {MAX_DEVICES_PER_NODE}), e.g. "
            "{'npu': 8}",
        )
        return
    # A count the rule set reads nowhere would be dropped silently (a typo in a plugin's name plans CPU).
    counted = tuple(name for name, rule in rules.accelerators.items() if rule.count_fact == SUPPLIED_COUNTS)
    there = f"it counts {', '.join(map(repr, counted))} there" if counted else "it adds no accelerator"
    for name in counts:
        if name in counted:
            continue
        own = rules.accelerators.get(name)
        yield InvalidRequest(
            field="Environment.device_counts",
            value=name,
            reason=f"the rule set resolving counts no such accelerator through device_counts ({there})"
            if own is None
            else f"{name!r} is "
            + ("counted by its own fact" if own.count_fact is not None else "always there")
            + f", not through device_counts ({there})",
            allowed=counted,
            fix="Name an accelerator the rule set adds, or pass the rule set that adds it "
            "(trainplan.resolve(request, env, rules=RULES))"
            if own is None
            else f"Write Environment({own.count_fact}=...) for {name!r}"
            if own.count_fact is not None
            else f"Leave {name!r} out: it is always there",
        )
