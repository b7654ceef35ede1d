"""From plan to loop, the decisions (pure): the precision recipe, the wrapper, DeepSpeed's config, and the
arguments other frameworks take (Lightning and Fabric, Hugging Face Accelerate and `accelerate launch`).

The effects' runtime and adapters turn these into torch objects and framework objects; nothing here imports
torch or a framework, so every mapping is tested from plans alone.
"""

from __future__ import annotations

from typing import Literal

import attrs

from trainplan.mapping.workers import process_group_timeout
from trainplan.resolve.refusal import incompatible
from trainplan.rules import (
    BUILTIN_RULES,
    FAMILY_RECIPES,
    LAUNCHERS,
    LIGHTNING_SIZES,
    OMIT,
    PRECISION_RECIPES,
    UNNAMED_RULES,
    AccelerateHandler,
    Encoding,
    FamilyRecipe,
    FrameworkAccelerator,
    Keyword,
    OptionRow,
    OptionTarget,
    PrecisionRecipe,
    Refused,
    Rules,
    lookup,
    option_checks,
    spellings,
)
from trainplan.rules import (
    MESH_DIMENSIONS as MESH_RULES,
)
from trainplan.spec.errors import Incompatible, InvalidRequest
from trainplan.spec.mesh import MeshLayout
from trainplan.spec.names import MESH_DIMENSIONS
from trainplan.spec.options import DeepSpeedOptions, option_value
from trainplan.spec.plan import Plan
from trainplan.spec.sizes import compared, size

LightningFramework = Literal["trainer", "fabric"]
"""Which of Lightning's two front ends takes the arguments: the Trainer or Fabric (their registries differ)."""


@attrs.frozen
class Encoded:
    """A value an effect turns into the object its target takes (`encoding`, a `rules.Encoding`: seconds as a
    `timedelta`, a name as torch's `ShardingStrategy`, ...); everything else is passed as it is."""

    value: object
    encoding: Encoding


def option_rows(plan: Plan, rules: Rules = BUILTIN_RULES) -> tuple[OptionRow, ...]:
    """The rows of the plan's options (its family's, in `rules`). An option of the record that `rules` has no row
    of (a downstream rule set's, read with another) is refused: `Incompatible` names the rule set to pass, else the
    check names the option."""
    options = plan.strategy.options
    rows = rules.options.get(plan.strategy.family, ())
    if options is None:
        return ()
    names = {row.name for row in rows}
    for name in options.extra:
        if name not in names:
            check_rules_at_hand(plan, rules, "option", name)
            option_checks.strategy_options(options, rules.options)
    return rows


def _values(plan: Plan, rows: tuple[OptionRow, ...]) -> dict[str, object]:
    options = plan.strategy.options
    return {} if options is None else {row.name: option_value(options, row.name, row.default) for row in rows}


def _refuse_lost(plan: Plan, row: OptionRow, value: object, framework: str, why: str) -> None:
    """An option `framework` cannot express is refused where it is not at its default (nothing is lost there)."""
    if value != row.default:
        raise incompatible(
            "option-framework",
            {f"strategy_options.{row.name}": value},
            option=row.name,
            value=value,
            framework=framework,
            why=why,
            default=row.default,
        )


def option_keywords(
    plan: Plan, target: OptionTarget, framework: str, rules: Rules = BUILTIN_RULES
) -> dict[str, object]:
    """The plan's options as `target` spells them in keywords (`rules.Keyword`: torch's wrapper and Lightning's
    strategy take them as keyword arguments, DeepSpeed's config at dotted paths), each row read in turn; a value an
    effect must encode is `Encoded`. An option the target cannot express (`Refused`) is refused unless at its
    default, naming `framework`."""
    rows = option_rows(plan, rules)
    values = _values(plan, rows)
    layout = (plan.num_nodes, plan.processes_per_node)
    keywords: dict[str, object] = {}
    for row in rows:
        spelling = spellings(row)[target]
        if isinstance(spelling, Refused):
            _refuse_lost(plan, row, values[row.name], framework, spelling.reason)
        elif isinstance(spelling, tuple):
            for keyword in spelling:
                if isinstance(keyword, Keyword):
                    value = values[row.name] if keyword.write is None else keyword.write(values, layout)
                    if value is not OMIT:
                        encoded = keyword.encoding != "plain"
                        keywords[keyword.key] = Encoded(value, keyword.encoding) if encoded else value
    return keywords


def fsdp_mesh_shape(plan: Plan) -> tuple[int, int]:
    """HYBRID_SHARD's device mesh: (replicas, shards) = (nodes, processes per node)."""
    return (plan.num_nodes, plan.processes_per_node)


def rules_named(rules: Rules) -> str:
    """A rule set as messages name it: where it is imported from, or what it is."""
    if rules is BUILTIN_RULES:
        return "trainplan's own rules"
    return "an unnamed rule set" if rules.reference is None else repr(rules.reference)


def rules_variable(rules: Rules) -> str:
    """What a fix calls the rule set to extend: its NAME in "module:NAME", else "rules"."""
    return "rules" if rules.reference is None else rules.reference.partition(":")[2]


def check_rules_at_hand(plan: Plan, rules: Rules, what: str, value: str) -> None:
    """`rules` lack the row of the plan's `what` (`value`): when they are not the rule set the plan was made from
    (`Plan.rules` names another), `Incompatible` says to pass that one, whose row it may be."""
    if plan.rules is not None and rules.plan_reference != plan.rules:
        named = plan.rules != UNNAMED_RULES
        raise incompatible(
            "plan-rules",
            {what: value},
            plan_rules=f"the rule set {plan.rules}" if named else "an unnamed rule set",
            given=rules_named(rules),
            what=what,
            value=value,
            how=f"the Rules {plan.rules} names, imported by you: a plan's reference is never imported"
            if named
            else "the one it was resolved with",
        )


def precision_recipe(plan: Plan, rules: Rules = BUILTIN_RULES) -> PrecisionRecipe:
    """How the plan's precision runs: autocast dtype (mixed), parameter dtype (true), loss scaling (a downstream
    precision's recipe is a row of its rule set, `rules`; other rules are told to pass that one)."""
    if plan.precision not in rules.precision_recipes:
        check_rules_at_hand(plan, rules, "precision", plan.precision)
    return lookup(rules.precision_recipes, plan.precision, name="PRECISION_RECIPES")


def family_recipe(plan: Plan) -> FamilyRecipe:
    """How the plan's strategy family wraps a model, and which Lightning strategy and Accelerate flags match it."""
    return lookup(FAMILY_RECIPES, plan.strategy.family, name="FAMILY_RECIPES")


def framework_accelerator(
    plan: Plan, framework: str = "Lightning", rules: Rules = BUILTIN_RULES
) -> FrameworkAccelerator:
    """How Lightning and Accelerate spell the plan's accelerator and its devices: a row of `rules` (a downstream
    accelerator's where its rule set gives one; without one, `Incompatible` names the accelerator, its rule set and
    how to add the row)."""
    found = rules.framework_accelerators.get(plan.accelerator)
    if found is not None:
        return found
    check_rules_at_hand(plan, rules, "accelerator", plan.accelerator)
    raise incompatible(
        "framework-accelerator",
        {"accelerator": plan.accelerator},
        rules=rules_named(rules),
        rules_builder=rules_variable(rules),
        framework=framework,
    )


def _framework_precision(plan: Plan, framework: str) -> None:
    """A downstream precision (a row of the plan's rule set, not trainplan's own) has no precision plugin in
    Lightning, Fabric or Accelerate: refused by name."""
    if plan.precision not in PRECISION_RECIPES:
        raise incompatible(
            "framework-precision",
            {"precision": plan.precision},
            rules=repr(plan.rules) if plan.rules is not None else "a rule set",
            framework=framework,
            supported=", ".join(repr(name) for name in PRECISION_RECIPES),
        )


def needs_grad_scaler(plan: Plan, rules: Rules = BUILTIN_RULES) -> bool:
    """fp16 AMP on CUDA scales the loss (float16 gradients underflow otherwise); nothing else does (a downstream
    precision's recipe says where it scales)."""
    return plan.accelerator in precision_recipe(plan, rules).grad_scaler_on


def deepspeed_config(
    plan: Plan, *, micro_batch_size: int = 1, gradient_accumulation_steps: int = 1, rules: Rules = BUILTIN_RULES
) -> dict[str, object]:
    """The DeepSpeed config for the plan's `DeepSpeedOptions` and precision, ready for `deepspeed.initialize` (a
    downstream precision's recipe is a row of the plan's rule set: pass it as `rules`)."""
    if not isinstance(plan.strategy.options, DeepSpeedOptions):
        raise incompatible("deepspeed-config", {"strategy": plan.strategy.name})
    counts: tuple[tuple[str, object], ...] = (
        ("micro_batch_size", micro_batch_size),
        ("gradient_accumulation_steps", gradient_accumulation_steps),
    )
    for name, value in counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise incompatible("deepspeed-count", {name: value}, name=name)
    recipe = precision_recipe(plan, rules)
    config: dict[str, object] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "zero_optimization": {},
        "fp16": {"enabled": recipe.autocast_dtype == "float16" or recipe.parameter_dtype == "float16"},
        "bf16": {"enabled": recipe.autocast_dtype == "bfloat16" or recipe.parameter_dtype == "bfloat16"},
    }
    for path, value in option_keywords(plan, "deepspeed_config", "DeepSpeed's config", rules).items():
        *parents, key = path.split(".")
        section = config
        for parent in parents:
            section = section.setdefault(parent, {})  # type: ignore[assignment]  # a section is a dict
        section[key] = value
    return config


# --------------------------------------------------------------------------------------------------
# The memory choice: activation checkpointing of the model's repeated blocks


def needs_checkpointing(plan: Plan) -> bool:
    """Whether the plan's memory choice recomputes activations (`plan.memory.checkpointing`): the runtime and every
    adapter carry it out or refuse."""
    return plan.memory is not None and plan.memory.checkpointing


def checkpointing_consequence(plan: Plan) -> str:
    """What losing the plan's activation checkpointing costs, from its memory arithmetic: "50.8 GiB needed per
    device without it vs 36.0 GiB available, 20.9 GiB with it"."""
    memory = plan.memory
    chosen = None if memory is None else memory.estimate
    if memory is None or chosen is None:
        return "the plan has no memory arithmetic"
    without = next(
        (item for item in memory.candidates if item.layout == chosen.layout and not item.checkpointing), None
    )
    with_it = f"{size(chosen.total)} with it"
    if without is None:
        return f"{with_it}, of {size(memory.budget_bytes)} available per device"
    needed, available = compared(without.total, memory.budget_bytes)
    return f"{needed} needed per device without it vs {available} available, {with_it}"


def block_classes(blocks: object) -> tuple[type, ...]:
    """The classes of the model's repeated blocks as a framework takes them (Lightning's policy, Accelerate's class
    names): a class or a tuple of classes; None is none."""
    if blocks is None:
        return ()
    given = blocks if isinstance(blocks, tuple) else (blocks,)
    if not given or not all(isinstance(item, type) for item in given):
        raise InvalidRequest(
            field="blocks",
            value=blocks,
            reason="a framework takes the classes of the model's repeated blocks (it finds their instances itself)",
            fix="Pass the block's class, blocks=MyBlock, or a tuple of classes, blocks=(Block, CrossBlock)",
        )
    return given


def checkpointing_refusal(
    plan: Plan, framework: str, call: str, *, why_not: str | None, missing_blocks: bool, checkpointed: bool
) -> Incompatible | None:
    """Why `framework` would lose the plan's activation checkpointing, or None: nothing to carry, the user
    checkpointed the blocks already (`checkpointed`), or the framework carries it and has the blocks' classes it
    needs (`missing_blocks`: it needs them and none were given). `why_not` says why the framework has no setting for
    it (None: it has one); `call` is the adapter to call again."""
    if not needs_checkpointing(plan) or checkpointed:
        return None
    layout = plan.memory.chosen if plan.memory is not None else None
    if why_not is not None:
        return incompatible(
            "framework-checkpointing",
            {"strategy": plan.strategy.name},
            layout=layout,
            consequence=checkpointing_consequence(plan),
            framework=framework,
            why=why_not,
            call=call,
        )
    if missing_blocks:
        return incompatible(
            "framework-checkpointing-blocks",
            {"strategy": plan.strategy.name},
            layout=layout,
            consequence=checkpointing_consequence(plan),
            framework=framework,
            call=call,
        )
    return None


def _lightning_blocks(
    plan: Plan,
    framework: LightningFramework,
    recipe: FamilyRecipe,
    blocks: tuple[type, ...],
    checkpointed: bool,
) -> tuple[dict[str, object], bool]:
    """The Lightning strategy's arguments for the model's blocks (FSDP: one unit each, `auto_wrap_policy`, and their
    `activation_checkpointing_policy` where the plan needs it), and whether the adapter checkpoints the blocks
    before Fabric's parallelize function; a plan whose checkpointing the strategy cannot carry is refused."""
    call = "lightning_trainer_arguments" if framework == "trainer" else "fabric_arguments"
    carrier = recipe.lightning_checkpointing
    why_not: str | None = None
    if carrier is None:
        why_not = f"runs it with {recipe.lightning_strategy}, which has no activation checkpointing setting"
    elif carrier == "parallelize" and framework == "trainer":
        why_not = (
            f"runs it with {recipe.lightning_strategy}, which applies the mesh in LightningModule.configure_model, "
            "out of the adapter's reach (checkpoint the blocks there)"
        )
    refusal = checkpointing_refusal(
        plan,
        _LIGHTNING_FRONT_ENDS[framework],
        call,
        why_not=why_not,
        missing_blocks=carrier == "policy" and not blocks,  # Fabric's parallelize finds the blocks in the model
        checkpointed=checkpointed,
    )
    if refusal is not None:
        raise refusal
    wanted = needs_checkpointing(plan) and not checkpointed
    arguments: dict[str, object] = {}
    if carrier == "policy" and blocks:
        arguments["auto_wrap_policy"] = set(blocks)  # Lightning takes a set of classes (not a frozenset)
        if wanted:
            arguments["activation_checkpointing_policy"] = set(blocks)
    return arguments, wanted and carrier == "parallelize"


# --------------------------------------------------------------------------------------------------
# Lightning and Fabric


@attrs.frozen(kw_only=True)
class LightningStrategy:
    """A Lightning/Fabric strategy to build: its class name and constructor arguments (plain values)."""

    class_name: str
    arguments: dict[str, object]
    registered_name: str | None = None
    """Where the framework builds the strategy itself: the name to pass instead of an object (torch_xla's)."""


@attrs.frozen(kw_only=True)
class LightningArguments:
    """What `Trainer(...)` / `Fabric(...)` take for this plan; the strategy still to be built as an object."""

    accelerator: str
    devices: list[int] | int
    num_nodes: int
    precision: str
    strategy: LightningStrategy
    sync_batchnorm: bool
    checkpoint_in_parallelize: bool = False
    """Fabric's ModelParallelStrategy: the adapter checkpoints the model's blocks before the parallelize function
    (the plan's memory choice recomputes activations)."""


_LIGHTNING_FRONT_ENDS: dict[LightningFramework, str] = {"trainer": "Lightning's Trainer", "fabric": "Fabric"}


def lightning_arguments(
    plan: Plan,
    framework: LightningFramework = "fabric",
    rules: Rules = BUILTIN_RULES,
    *,
    blocks: tuple[type, ...] = (),
    checkpointed: bool = False,
) -> LightningArguments:
    """The plan as Lightning Trainer / Fabric arguments, nothing lost: the strategy's options become the
    strategy object's arguments (DDP's flags and timeout, FSDP's sharding and offload, DeepSpeed's stage). A
    strategy only Fabric registers (`xla_fsdp`) is refused for the Trainer. A downstream accelerator is spelled as
    its rule set (`rules`) says; a downstream precision has no Lightning plugin and is refused.

    `blocks`, the classes of the model's repeated blocks, make FSDP's units (one per block) and, where the plan's
    memory choice recomputes activations, its activation checkpointing policy; a strategy that cannot carry that
    is refused by name (`framework-checkpointing`), unless the blocks are `checkpointed` already."""
    recipe = family_recipe(plan)
    _framework_precision(plan, _LIGHTNING_FRONT_ENDS[framework])
    if recipe.lightning_strategy is None:
        raise incompatible("lightning-strategy", {"strategy": plan.strategy.name})
    if framework == "trainer" and recipe.trainer_instead is not None:
        raise incompatible(
            "lightning-trainer-strategy",
            {"strategy": plan.strategy.name},
            strategy_class=recipe.lightning_strategy,
            instead=recipe.trainer_instead,
        )
    if recipe.lightning_precisions is not None and plan.precision not in recipe.lightning_precisions:
        raise incompatible(
            "lightning-precision",
            {"strategy": plan.strategy.name, "precision": plan.precision},
            strategy_class=recipe.lightning_strategy,
            supported=", ".join(repr(name) for name in sorted(recipe.lightning_precisions)),
        )
    # The options first: one Lightning cannot express is refused by its own name (tp_group_backend, cp_rotate_method, a
    # pipeline schedule), before the mesh's degrees it needs (pp, cp) are refused for Lightning's 2-D mesh.
    keywords = option_keywords(plan, "lightning", _LIGHTNING_FRONT_ENDS[framework], rules)
    arguments: dict[str, object] = {}
    if plan.mesh is not None:  # the degrees' rows spell them through the mesh
        arguments.update(lightning_sizes(plan.mesh))
    arguments.update(keywords)
    carried, in_parallelize = _lightning_blocks(plan, framework, recipe, blocks, checkpointed)
    arguments.update(carried)
    start_method = lookup(LAUNCHERS, plan.launcher, name="LAUNCHERS").start_method
    if start_method is not None:  # DDP's spawn and fork strategies start their processes themselves
        arguments["start_method"] = start_method
    if plan.process_group_backend is not None and recipe.lightning_backend:
        arguments["process_group_backend"] = plan.process_group_backend
    spelling = framework_accelerator(plan, _LIGHTNING_FRONT_ENDS[framework], rules)
    devices: list[int] | int = plan.processes_per_node
    if spelling.lightning_devices == "indices":
        devices = list(plan.devices)
    elif spelling.lightning_devices == "one_index_or_count":
        devices = list(plan.devices) if len(plan.devices) == 1 else len(plan.devices)
    return LightningArguments(
        accelerator=spelling.lightning,
        devices=devices,
        num_nodes=plan.num_nodes,
        precision=plan.precision,
        strategy=LightningStrategy(
            class_name=recipe.lightning_strategy, arguments=arguments, registered_name=recipe.lightning_registered
        ),
        sync_batchnorm=plan.request.sync_batchnorm is True,
        checkpoint_in_parallelize=in_parallelize,
    )


def lightning_sizes(mesh: MeshLayout) -> dict[str, int]:
    """The mesh as Lightning's `ModelParallelStrategy` sizes (`data_parallel_size`, `tensor_parallel_size`), or
    `Incompatible` when Lightning's two dimensions cannot hold it (pipeline or context parallelism, or replicas and
    shards both above 1)."""
    sizes = {size.argument: 1 for size in LIGHTNING_SIZES}
    joined: dict[str, dict[str, int]] = {argument: {} for argument in sizes}
    for name in MESH_DIMENSIONS:
        degree, rule = mesh.size(name), MESH_RULES[name]
        if degree == 1:
            continue
        if rule.lightning_size is None:
            raise incompatible(
                "lightning-mesh",
                {name: degree},
                lost=f"its {rule.title} dimension ({name}={degree}) would be lost",
                fix=f"Use {name}=1 with Lightning, or run the plan's own mesh through trainplan.runtime (rt.mesh)",
            )
        sizes[rule.lightning_size] *= degree
        joined[rule.lightning_size][name] = degree
    for argument, degrees in joined.items():
        if len(degrees) > 1:
            spelled = " × ".join(f"{name}={degree}" for name, degree in degrees.items())
            raise incompatible(
                "lightning-mesh",
                degrees,
                lost=f"{spelled} would become one {argument.removesuffix('_size')} dimension",
                fix=(
                    "Use one of them with Lightning (e.g. dp_shard alone: FSDP2 over the data-parallel dimension), or "
                    "run the plan's own mesh through trainplan.runtime (rt.mesh), which keeps both"
                ),
            )
    return sizes


# --------------------------------------------------------------------------------------------------
# Hugging Face Accelerate


@attrs.frozen(kw_only=True)
class AccelerateArguments:
    """What `Accelerator(...)` takes for this plan (its kwargs handlers as plain values) and the matching
    `accelerate launch` command-line flags."""

    cpu: bool
    mixed_precision: Literal["no", "fp16", "bf16", "fp8"]
    ddp: dict[str, object]  # DistributedDataParallelKwargs
    process_group: dict[str, object]  # InitProcessGroupKwargs (backend, timeout seconds)
    fsdp: dict[str, object] | None  # FullyShardedDataParallelPlugin
    deepspeed: dict[str, object] | None  # DeepSpeedPlugin
    launch_flags: list[str]
    parallelism: dict[str, int] | None = None  # ParallelismConfig (a device mesh's sizes)
    context_parallel: dict[str, object] | None = None  # ParallelismConfig's cp_handler (TorchContextParallelConfig)


def accelerate_arguments(
    plan: Plan,
    rules: Rules = BUILTIN_RULES,
    *,
    blocks: tuple[type, ...] | None = None,
    checkpointed: bool = False,
) -> AccelerateArguments:
    """The plan as Accelerate's `Accelerator` arguments and `accelerate launch` flags (a downstream accelerator or
    precision as its rule set, `rules`, says).

    `blocks`, the classes of the model's repeated blocks, become the FSDP plugin's units (transformer_based_wrap) and,
    where the plan's memory choice recomputes activations, its activation checkpointing; a plan without an FSDP
    plugin cannot carry that and is refused (`framework-checkpointing`), unless the blocks are `checkpointed`
    already. None: the model is not at hand (the launch flags), and only the flag is written."""
    recipe = precision_recipe(plan, rules)
    if recipe.accelerate is None:
        _framework_precision(plan, "Accelerate")
        raise incompatible("accelerate-precision", {"precision": plan.precision})
    family = family_recipe(plan)
    if family.accelerate_why_not is not None:
        raise incompatible(
            "accelerate-strategy",
            {"strategy": plan.strategy.name},
            why=family.accelerate_why_not,
            instead=family.accelerate_instead,
        )
    handlers, extra = _accelerate_handlers(plan, rules)
    process_group = dict(handlers.get("InitProcessGroupKwargs", {}))
    process_group["timeout"] = Encoded(process_group_timeout(plan, rules), "timedelta")
    if plan.process_group_backend is not None:
        process_group["backend"] = plan.process_group_backend
    fsdp = handlers.get("FullyShardedDataParallelPlugin")
    deepspeed = handlers.get("DeepSpeedPlugin")
    parallelism: dict[str, int] | None = None
    if plan.mesh is not None:
        parallelism = accelerate_parallelism(plan.mesh)
        if plan.mesh.size("dp_shard") > 1 or plan.mesh.size("cp") > 1:
            # Accelerate shards over dp_shard (and cp) with FSDP2 only, and `accelerate launch` takes a parallelism
            # config only beside `--use_fsdp --fsdp_version 2`. A mesh with nothing to shard (replicas, tensor
            # parallelism) launches as --multi_gpu; its ParallelismConfig reaches the Accelerator in code.
            fsdp = {"fsdp_version": 2}
            extra += ["--use_fsdp", "--fsdp_version", "2", "--use_parallelism_config"]
            for field, size in parallelism.items():
                extra += [f"--parallelism_config_{field}", str(size)]
    fsdp, checkpointing_flags = _accelerate_blocks(plan, fsdp, blocks, checkpointed)
    extra += checkpointing_flags
    flags = ["--num_processes", str(plan.world_size), "--num_machines", str(plan.num_nodes)]
    flags += ["--mixed_precision", recipe.accelerate]
    spelling = framework_accelerator(plan, "Accelerate", rules)
    if spelling.accelerate_cpu:
        flags.append("--cpu")
    elif spelling.accelerate_gpu_ids:
        # accelerate launch makes --gpu_ids the workers' CUDA_VISIBLE_DEVICES as written: for the first n GPUs (a
        # count) nothing is pinned, so the GPUs a scheduler made visible stay; a selection names physical GPUs.
        if plan.devices != tuple(range(len(plan.devices))):
            physical = plan.physical_devices or tuple(str(index) for index in plan.devices)
            flags += ["--gpu_ids", ",".join(physical)]
        several = family_recipe(plan).accelerate_multi_gpu or (plan.mesh is not None and fsdp is None)
        if plan.world_size > 1 and several:
            flags.append("--multi_gpu")
    flags += list(family_recipe(plan).accelerate_launch) + extra
    if plan.num_nodes > 1:
        if plan.cluster.node_rank is not None:
            flags += ["--machine_rank", str(plan.cluster.node_rank)]
        flags += ["--main_process_ip", plan.cluster.main_address]
        if plan.cluster.main_port is not None:
            flags += ["--main_process_port", str(plan.cluster.main_port)]
    return AccelerateArguments(
        cpu=spelling.accelerate_cpu,
        mixed_precision=recipe.accelerate,
        ddp=handlers.get("DistributedDataParallelKwargs", {}),
        process_group=process_group,
        fsdp=fsdp,
        deepspeed=deepspeed,
        launch_flags=flags,
        parallelism=parallelism,
        context_parallel=handlers.get("TorchContextParallelConfig"),
    )


def _accelerate_blocks(
    plan: Plan, fsdp: dict[str, object] | None, blocks: tuple[type, ...] | None, checkpointed: bool
) -> tuple[dict[str, object] | None, list[str]]:
    """The FSDP plugin's fields for the model's blocks and the plan's activation checkpointing (Accelerate applies
    it through its FSDP plugin only, on the units of its wrap policy), and the launch flags that say it. `blocks`
    None: the launch flags alone (the script's Accelerator, built with the model's blocks, refuses or carries it)."""
    refusal = None
    if blocks is not None:
        refusal = checkpointing_refusal(
            plan,
            "Accelerate",
            "accelerator_arguments",
            why_not=None
            if fsdp is not None
            else "applies activation checkpointing through its FSDP plugin only, "
            f"and strategy {plan.strategy.name!r} runs without one",
            missing_blocks=not blocks,
            checkpointed=checkpointed,
        )
    if refusal is not None:
        raise refusal
    if fsdp is None:
        return None, []
    fields = dict(fsdp)
    if blocks:
        fields["auto_wrap_policy"] = "transformer_based_wrap"
        fields["transformer_cls_names_to_wrap"] = [block.__name__ for block in blocks]
    if needs_checkpointing(plan) and not checkpointed:
        fields["activation_checkpointing"] = True
        return fields, ["--fsdp_activation_checkpointing", "true"]
    return fields, []


def _accelerate_handlers(plan: Plan, rules: Rules) -> tuple[dict[AccelerateHandler, dict[str, object]], list[str]]:
    """The plan's options as Accelerate's handler fields (`rules.HandlerField`), each row read in turn, and the
    `accelerate launch` flags that carry them (a flag's bool is written true/false)."""
    rows = option_rows(plan, rules)
    values = _values(plan, rows)
    layout = (plan.num_nodes, plan.processes_per_node)
    handlers: dict[AccelerateHandler, dict[str, object]] = {}
    flags: list[str] = []
    for row in rows:
        spelling = row.accelerate
        if isinstance(spelling, Refused):
            _refuse_lost(plan, row, values[row.name], "Accelerate", spelling.reason)
        elif isinstance(spelling, tuple):
            for field in spelling:
                value = values[row.name] if field.write is None else field.write(values, layout)
                if value is OMIT:
                    continue
                handlers.setdefault(field.handler, {})[field.key] = value
                if field.flag is not None:
                    flags += [field.flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return handlers, flags


def accelerate_parallelism(mesh: MeshLayout) -> dict[str, int]:
    """The mesh as Accelerate's `ParallelismConfig` sizes (Accelerate 1.15: dp_replicate, dp_shard, tp, cp), or
    `Incompatible` where Accelerate cannot hold it: a dimension it lacks (pipeline stages), and tensor or context
    parallelism over plain replicas (Accelerate composes them with sharded data parallelism only)."""
    sizes: dict[str, int] = {}
    for name in MESH_DIMENSIONS:
        degree, rule = mesh.size(name), MESH_RULES[name]
        if rule.accelerate_why_not and degree > 1:
            raise incompatible(
                "accelerate-mesh",
                {name: degree},
                why=rule.accelerate_why_not,
                fix=f"Use {name}=1 with Accelerate, or run the plan's own mesh through trainplan.runtime (rt.mesh)",
            )
        if rule.accelerate_size is not None and not rule.accelerate_why_not:
            sizes[rule.accelerate_size] = degree
        elif degree > 1:
            raise incompatible(
                "accelerate-mesh",
                {name: degree},
                why=f"Accelerate's ParallelismConfig has no {rule.title} dimension, so {name}={degree} would be lost",
                fix=f"Use {name}=1 with Accelerate, or run the plan's own mesh through trainplan.runtime (rt.mesh)",
            )
    # Accelerate's own rule (ParallelismConfig.__post_init__): tp or cp over dp_replicate needs dp_shard above 1.
    inner = {name: mesh.size(name) for name in ("tp", "cp") if mesh.size(name) > 1}
    if inner and mesh.size("dp_replicate") > 1 and mesh.size("dp_shard") == 1:
        raise incompatible(
            "accelerate-mesh",
            {"dp_replicate": mesh.size("dp_replicate"), **inner},
            why="Accelerate composes tensor and context parallelism with sharded data parallelism only, not with "
            "plain replicas (dp_replicate above 1 with dp_shard=1)",
            fix="Shard the data-parallel ranks instead (dp_shard, FSDP2), or shard and replicate both (HSDP)",
        )
    return sizes


def accelerate_mesh_refusal(plan: Plan, rules: Rules = BUILTIN_RULES) -> Incompatible | None:
    """Why `accelerate.Accelerator` cannot take this plan's mesh, or None: Accelerate builds a ParallelismConfig
    mesh for FSDP2 or multi-GPU runs only, never for several CPU processes (its `_validate_accelerator`)."""
    spelling = framework_accelerator(plan, "Accelerate", rules) if plan.mesh is not None else None
    if spelling is not None and not spelling.accelerate_processes and plan.world_size > 1:
        return incompatible(
            "accelerate-mesh",
            {"strategy": plan.strategy.name, "accelerator": plan.accelerator, "world_size": plan.world_size},
            why="Accelerate 1.15 builds a ParallelismConfig mesh for GPU runs only (FSDP2 or multi-GPU), not for "
            "several CPU processes",
            fix="Run the plan's own mesh on CPU processes through trainplan.runtime (rt.mesh), or run on GPUs",
        )
    return None


def accelerate_launch_flags(plan: Plan, rules: Rules = BUILTIN_RULES) -> list[str]:
    """The `accelerate launch` flags that start this plan's processes. Several CPU processes are refused
    (accelerate launch starts those only through MPI), and so are several nodes planned without a main address
    (`accelerate-main-address`: every node would meet on its own loopback)."""
    if not framework_accelerator(plan, "Accelerate", rules).accelerate_processes and plan.world_size > 1:
        raise incompatible("accelerate-cpu-processes", {"accelerator": plan.accelerator, "world_size": plan.world_size})
    if plan.num_nodes > 1 and any(note.code == "multi-node-local" for note in plan.notes):
        # No cluster and no MASTER_ADDR gave the nodes a meeting point: the plan's 127.0.0.1 is every node's own.
        raise incompatible("accelerate-main-address", {"num_nodes": plan.num_nodes}, nodes=plan.num_nodes)
    return list(accelerate_arguments(plan, rules).launch_flags)


def framework_sync_batchnorm(plan: Plan, framework: str) -> None:
    """Fabric and Accelerate have no sync_batchnorm setting: refuse to lose the plan's, with the fix."""
    if plan.request.sync_batchnorm is True and plan.world_size > 1:
        raise incompatible("sync-batchnorm-framework", {"sync_batchnorm": True}, framework=framework)


__all__ = [
    "AccelerateArguments",
    "Encoded",
    "LightningArguments",
    "LightningStrategy",
    "accelerate_arguments",
    "accelerate_launch_flags",
    "accelerate_mesh_refusal",
    "accelerate_parallelism",
    "block_classes",
    "check_rules_at_hand",
    "checkpointing_consequence",
    "checkpointing_refusal",
    "deepspeed_config",
    "family_recipe",
    "framework_sync_batchnorm",
    "fsdp_mesh_shape",
    "lightning_arguments",
    "lightning_sizes",
    "needs_checkpointing",
    "needs_grad_scaler",
    "option_keywords",
    "option_rows",
    "precision_recipe",
    "rules_named",
    "rules_variable",
]
