"""Scaling out on existing engines: a plan written as a torchrun command line, a SLURM batch script or a
Kubeflow PyTorchJob manifest.

Pure: text from a plan. The torchrun line and the sbatch script start the workers with torchrun, so every
worker carries torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and a plain
env:// script runs unchanged; inside, `trainplan.resolve()` recognises the job and takes its layout. GPUs
follow torchrun's convention: the node's selected GPUs are made visible through CUDA_VISIBLE_DEVICES and local
rank i drives `cuda:i`; for a device count (the first n) nothing is pinned, so the GPUs a scheduler made visible
on each node stay. One node runs `--standalone` (a free port each run, so two jobs on one box never clash); several
nodes meet through torchrun's c10d rendezvous at the main address and port, which must be the same on
every node (the shell stops with a message when they are not set).

The sbatch script runs one task per node, which asks for a CPU per worker (`--cpus-per-task`, passed on to
srun, which does not inherit it), so SLURM does not bind all of a node's workers to one CPU. A node that fails
stops the others at once (`srun --kill-on-bad-exit=1`): none waits out torchrun's exit barrier. The job's exit
code is srun's, the highest of its tasks': torchrun's 1 (whatever the failing worker's own), or 128 + the signal
of a node SLURM stopped; a `# note:` in the script says so, and the job's log shows each worker's code.

A plan of a downstream rule set carries the rule set's reference (TRAINPLAN_RULES), which `trainplan.resolve()`
compares inside the job with the rule set the script imported or passes (a variable never imports a module), and
a downstream accelerator is carried as chosen (with a note: the job's script supplies its device count, which
trainplan cannot probe); a rule set without a name cannot travel and is refused.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence

from trainplan.mapping.frameworks import check_rules_at_hand, rules_named, rules_variable
from trainplan.mapping.workers import (
    carried_request,
    carried_rules,
    downstream_devices_note,
    script_strategy_note,
    visibility_variable,
)
from trainplan.resolve.refusal import incompatible
from trainplan.rules import (
    BUILTIN_RULES,
    KUBEFLOW_MASTER_PORT,
    KUBERNETES_DEVICE_RESOURCES,
    REQUEST_VARIABLE,
    RULES_VARIABLE,
    SELECTED_DEVICES_VARIABLE,
    SLURM_PORT_BASE,
    Rules,
    lookup,
)
from trainplan.spec.errors import InvalidRequest
from trainplan.spec.plan import Plan
from trainplan.spec.text import one_line

DEFAULT_SCRIPT: tuple[str, ...] = ("train.py",)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _command(command: Sequence[str]) -> list[str]:
    """torchrun runs a Python script by path, or a module with `-m` (its own `--module` flag)."""
    words = list(command) or list(DEFAULT_SCRIPT)
    if words[0] == "-m":
        return ["-m", *words[1:]]
    if words[0].startswith("-"):
        # torchrun takes no interpreter options (-c, -u, -X ...): run the interpreter itself as the program.
        return ["--no-python", "python", *words]
    if not words[0].endswith(".py"):
        return ["--no-python", *words]
    return words


def _notes(plan: Plan) -> list[str]:
    notes = [note for note in plan.notes if note.code == "script-strategy"]
    own = script_strategy_note(plan.strategy.name)
    if own is not None and not notes:
        notes.append(own)
    devices = downstream_devices_note(plan)
    if devices is not None:
        notes.append(devices)
    return [f"# note: {one_line(note.message)}" for note in notes]


def _torchrun(plan: Plan, command: Sequence[str], *, address: _Part, port: _Part, run_id: _Part) -> list[_Word]:
    parts: list[_Word] = [_Word("torchrun")]
    if plan.num_nodes == 1:
        parts += [_Word("--standalone"), _Word("--nnodes=1")]
    else:
        parts += [
            _Word(f"--nnodes={plan.num_nodes}"),
            _Word("--rdzv-backend=c10d"),
            _Word("--rdzv-endpoint=", address, ":", port),
            _Word("--rdzv-id=", run_id),
        ]
    parts.append(_Word(f"--nproc-per-node={plan.processes_per_node}"))
    return parts + [_Word(word) for word in _command(command)]


class _Placeholder:
    """Shell text trainplan writes itself (`${MASTER_ADDR:?…}`, `$SLURM_JOB_ID`), expanded by the shell inside
    double quotes; never built from a plan's or a script's values."""

    def __init__(self, text: str) -> None:
        if any(character in text for character in '"\\`\n'):
            raise ValueError(f"a placeholder is plain shell expansion: {text!r}")
        self.text = text


_Part = str | _Placeholder


class _Word:
    """A word of an emitted line, built from parts: text (a plan's value, a script's word) is quoted literally
    (`shlex.quote`), and only trainplan's own placeholders stay expandable, in double quotes, so no value can
    close a quote, end the line or run a command."""

    def __init__(self, *parts: _Part) -> None:
        self.parts = parts

    def shell(self) -> str:
        texts = [part for part in self.parts if isinstance(part, str)]
        if len(texts) == len(self.parts):
            return shlex.quote("".join(texts))
        if all(shlex.quote(text) == text for text in texts if text):  # nothing to quote: one double-quoted word
            return '"' + "".join(part if isinstance(part, str) else part.text for part in self.parts) + '"'
        return "".join(
            f'"{part.text}"' if isinstance(part, _Placeholder) else shlex.quote(part) for part in self.parts if part
        )


def _quote(words: Sequence[_Word]) -> str:
    return " ".join(word.shell() for word in words)


def _gpu_selection(plan: Plan) -> dict[str, str]:
    """The variables that make exactly the plan's GPUs visible, in order, when they are not simply the first n.

    For the first n (a device count), nothing is pinned: the GPUs a scheduler made visible on each node stay
    visible, as the sbatch script leaves them."""
    visibility = visibility_variable(plan)
    if visibility is None or plan.devices == tuple(range(len(plan.devices))):
        return {}
    physical = plan.physical_devices or tuple(str(index) for index in plan.devices)
    variables = {visibility: ",".join(physical)}
    if list(physical) != [str(index) for index in plan.devices]:
        variables[SELECTED_DEVICES_VARIABLE] = ",".join(str(index) for index in plan.devices)
    return variables


def emit_torchrun(plan: Plan, command: Sequence[str] = ()) -> str:
    """The torchrun command line that starts this plan's processes on one node (run it on every node)."""
    rules = carried_rules(plan, "torchrun line")
    if plan.num_nodes > 1:
        address: _Part = plan.cluster.main_address
        if address in _LOOPBACK:
            address = _Placeholder("${MASTER_ADDR:?export MASTER_ADDR=<the host of node 0> on every node}")
        port: _Part = (
            str(plan.cluster.main_port)
            if plan.cluster.main_port is not None
            else _Placeholder("${MASTER_PORT:?export the same free MASTER_PORT on every node}")
        )
        words = _torchrun(plan, command, address=address, port=port, run_id="trainplan")
    else:
        words = _torchrun(plan, command, address="", port="", run_id="")
    variables = _gpu_selection(plan)
    if rules is not None:
        variables[RULES_VARIABLE] = rules
    carried = carried_request(plan)
    if carried is not None:
        variables[REQUEST_VARIABLE] = carried
    environment = "".join(f"{key}={shlex.quote(value)} " for key, value in variables.items())
    return "\n".join([*_notes(plan), environment + _quote(words)])


_SLURM_JOB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}")


def _check_slurm_job_name(name: object) -> None:
    if not isinstance(name, str) or not _SLURM_JOB_NAME.fullmatch(name):
        raise InvalidRequest(
            field="job name",
            value=name,
            reason="the sbatch script writes it into an #SBATCH line, which holds one word: a SLURM job name is "
            "letters, digits and '.', '_', '+', '-' (no spaces, newlines or shell characters), at most 128 "
            "characters, not starting with '.', '+' or '-'",
            fix="Write a name such as --job-name train-llm",
        )


def _srun(plan: Plan) -> list[_Word]:
    """srun's options: one task per node with the CPUs the batch job asked for, every node stopped when one fails."""
    return [
        _Word("srun"),
        _Word("--kill-on-bad-exit=1"),
        _Word("--ntasks-per-node=1"),
        _Word("--cpus-per-task=", _Placeholder(f"${{SLURM_CPUS_PER_TASK:-{plan.processes_per_node}}}")),
    ]


def emit_slurm(plan: Plan, command: Sequence[str] = (), *, rules: Rules = BUILTIN_RULES, name: str = "train") -> str:
    """An sbatch script named `name` (`#SBATCH --job-name`): one srun task per node, with a CPU per worker, runs
    torchrun, which starts that node's workers; a node that fails stops the others. A downstream accelerator's
    row is one of the plan's rule set, `rules` (its `slurm_gpus` says whether SLURM allocates its devices as
    GPUs)."""
    reference = carried_rules(plan, "sbatch script")
    _check_slurm_job_name(name)
    accelerator = rules.accelerators.get(plan.accelerator)
    if accelerator is None:
        check_rules_at_hand(plan, rules, "accelerator", plan.accelerator)
        accelerator = lookup(rules.accelerators, plan.accelerator, name="ACCELERATORS")
    lines = [
        "#!/bin/bash",
        f"#SBATCH --nodes={plan.num_nodes}",
        "#SBATCH --ntasks-per-node=1",
        "# The task runs all of its node's workers: it asks for a CPU each (alone, SLURM gives it one and binds every",
        "# worker to that CPU).",
        f"#SBATCH --cpus-per-task={plan.processes_per_node}",
    ]
    visibility = visibility_variable(plan)
    narrowed = visibility is not None and plan.devices != tuple(range(len(plan.devices)))
    if accelerator.slurm_gpus:
        # Asking for the first max+1 GPUs keeps every index the plan names; the worker line narrows to them.
        wanted = max(plan.devices) + 1 if narrowed else len(plan.devices)
        lines.append(f"#SBATCH --gpus-per-node={wanted}")
    lines.append(f"#SBATCH --job-name={name}")
    lines += [
        *_notes(plan),
        "# note: the job's exit code is not the failing worker's: torchrun's 1, or 137/143 for a node SLURM stopped "
        "(the log shows each worker's)",
        "",
    ]
    if reference is not None:
        lines += [
            "# The rule set the plan was made from: the script imports it or passes it (trainplan.resolve(rules=...)).",
            f"export {RULES_VARIABLE}={shlex.quote(reference)}",
        ]
    carried = carried_request(plan)
    if carried is not None:
        lines += [
            "# The request's choices beyond the layout (precision, strategy, options): trainplan.resolve() reads them.",
            f"export {REQUEST_VARIABLE}={shlex.quote(carried)}",
        ]
    lines += [
        f"# One task per node runs torchrun, which starts the node's {plan.processes_per_node} worker(s) with",
        "# torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): plain env:// scripts",
        "# and trainplan.resolve() both run unchanged. srun is given the task's CPUs (from SLURM 22.05 it does not",
        "# inherit sbatch's --cpus-per-task). A node whose torchrun fails stops the others at once",
        "# (--kill-on-bad-exit=1): none waits out torchrun's exit barrier (300 s).",
    ]
    if plan.num_nodes > 1:
        lines += [
            "# The nodes meet through torchrun's c10d rendezvous on the first node of the allocation.",
            'export MASTER_ADDR="${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}"',
            f'export MASTER_PORT="${{MASTER_PORT:-$(({SLURM_PORT_BASE} + SLURM_JOB_ID % 10000))}}"',
        ]
    words = _torchrun(
        plan,
        command,
        address=_Placeholder("$MASTER_ADDR"),
        port=_Placeholder("$MASTER_PORT"),
        run_id=_Placeholder("$SLURM_JOB_ID"),
    )
    worker = _quote(words)
    if narrowed:
        positions = ",".join(f"${{visible[{index}]}}" for index in plan.devices)
        unset = ",".join(str(index) for index in range(max(plan.devices) + 1))
        inner = (
            f'IFS=, read -ra visible <<< "${{{visibility}:-{unset}}}"; '
            f'export {visibility}="{positions}" '
            f"{SELECTED_DEVICES_VARIABLE}={','.join(str(index) for index in plan.devices)}; exec {worker}"
        )
        lines.append(f"# The plan's GPUs {list(plan.devices)} among the node's visible ones, in that order:")
        worker = "bash -c " + shlex.quote(inner)
    lines.append(f"{_quote(_srun(plan))} {worker}")
    return "\n".join(lines)


_SRUN_LINE = re.compile(r'srun(?: "?--[a-z-]+=[^\s"]*"?)+ (?P<worker>.+)')


def slurm_worker_line(script: str) -> str:
    """The command each srun task runs (the last line of `emit_slurm`, without `srun` and its options)."""
    found = _SRUN_LINE.fullmatch(script.splitlines()[-1])
    if found is None:
        raise ValueError("not a script written by emit_slurm")
    return found.group("worker")


_KUBERNETES_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")


def emit_kubeflow(
    plan: Plan, command: Sequence[str] = (), *, image: str, name: str = "train", rules: Rules = BUILTIN_RULES
) -> str:
    """A PyTorchJob manifest (Kubeflow training operator, kubeflow.org/v1) that runs the plan: one pod per node
    (a Master and num_nodes - 1 Workers), `nvidia.com/gpu` per pod for CUDA plans, the image given.

    The operator gives every pod MASTER_ADDR (the master's service), MASTER_PORT, WORLD_SIZE and RANK (the
    pod's index). One process per pod runs the script itself: inside, `trainplan.resolve()` detects the
    Kubeflow pod. Several processes per pod run it under torchrun, whose node rank, main address and port come
    from those variables (`$(RANK)`, expanded by Kubernetes), so any operator version fits; inside, the workers
    carry torchrun's variables.
    """
    reference = carried_rules(plan, "PyTorchJob")
    given_image: object = image
    given_name: object = name
    if not isinstance(given_image, str) or not _IMAGE.fullmatch(given_image):
        raise InvalidRequest(
            field="image",
            value=image,
            reason="a PyTorchJob needs the container image that holds the script, torch and trainplan",
            fix="Write an image reference such as --image ghcr.io/me/train:1.0",
        )
    if not isinstance(given_name, str) or not _KUBERNETES_NAME.fullmatch(given_name):
        raise InvalidRequest(
            field="job name",
            value=name,
            reason="Kubernetes names are lower-case letters, digits and '-', starting and ending with a letter or "
            "digit, at most 52 characters (the pods are named <name>-worker-<index>)",
            fix="Write a name such as --job-name train-llm",
        )
    if plan.accelerator not in rules.kubernetes_resources:
        check_rules_at_hand(plan, rules, "accelerator", plan.accelerator)
        if plan.accelerator not in BUILTIN_RULES.accelerators:  # a downstream row: its rule set can name one
            raise incompatible(
                "kubeflow-resource",
                {"accelerator": plan.accelerator},
                rules=rules_named(rules),
                rules_builder=rules_variable(rules),
            )
        supported = " and ".join(repr(name) for name in KUBERNETES_DEVICE_RESOURCES)
        raise incompatible("kubeflow-accelerator", {"accelerator": plan.accelerator}, supported=supported)
    resource = rules.kubernetes_resources[plan.accelerator]
    port = plan.cluster.main_port or KUBEFLOW_MASTER_PORT
    if not command:
        raise InvalidRequest(
            field="script",
            value="",
            reason="a PyTorchJob runs a script in its image, and none was named",
            fix="Name the script after --, e.g. trainplan plan --emit kubeflow --image IMAGE -- train.py --lr 0.1",
        )
    for position, word in enumerate(command):
        if any("\ud800" <= character <= "\udfff" for character in word):
            raise InvalidRequest(
                field="script",
                value=word,
                reason=f"word {position} of the command holds bytes that are not UTF-8 (a file name or argument "
                "as the operating system gave it), and a PyTorchJob's command is UTF-8 text: the pod would run "
                "a different word",
                fix="Rename the file or write the argument in UTF-8 text",
            )
    # The kubelet expands $(VAR) in a container's command and env, and reads `$$` as `$`: every `$` of the
    # script's words and of the carried values is doubled, so each reaches the process as written.
    words = [_kubelet_literal(word) for word in command]
    if plan.processes_per_node == 1:
        if words[0] == "-m" or words[0].startswith("-") or words[0].endswith(".py"):
            words = ["python", *words]
    else:
        words = [
            "torchrun",
            f"--nnodes={plan.num_nodes}",
            f"--nproc-per-node={plan.processes_per_node}",
            "--node-rank=$(RANK)",
            "--master-addr=$(MASTER_ADDR)",
            "--master-port=$(MASTER_PORT)",
            *_command(words),
        ]
    container: dict[str, object] = {"name": "pytorch", "image": image, "command": words}
    carried = carried_request(plan)
    carried_variables = {RULES_VARIABLE: reference, REQUEST_VARIABLE: carried}
    if reference is not None or carried is not None:
        container["env"] = [
            {"name": key, "value": _kubelet_literal(value)} for key, value in carried_variables.items() if value
        ]
    container["ports"] = [{"name": "pytorchjob-port", "containerPort": port}]
    if resource is not None:
        # A Kubernetes quantity: the operator's API types resource limits as strings.
        container["resources"] = {"limits": {resource: str(len(plan.devices))}}
    replicas: dict[str, object] = {"Master": _replica(1, container)}
    if plan.num_nodes > 1:
        replicas["Worker"] = _replica(plan.num_nodes - 1, container)
    manifest: dict[str, object] = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        # runPolicy as the operator defaults it (pods kept for inspection): its API marks the field required.
        "spec": {
            "nprocPerNode": str(plan.processes_per_node),
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": replicas,
        },
    }
    header = list(_notes(plan))  # one line each (`one_line`): a note cannot end its comment
    chosen = tuple(plan.devices)
    if resource is not None and chosen != tuple(range(len(chosen))):
        header.append(
            f"# note: the plan chose GPUs {', '.join(str(device) for device in chosen)} by index; a pod cannot "
            f"choose physical GPUs: Kubernetes gives each pod {len(chosen)} GPU(s) of its choosing"
        )
    header.append(
        f"# {plan.num_nodes} pod(s) x {plan.processes_per_node} process(es) = world size {plan.world_size}; "
        "kubectl apply -f this file"
    )
    return "\n".join([*header, *_yaml(manifest, 0)])


def _kubelet_literal(text: str) -> str:
    """`text` as the kubelet passes it on unexpanded: it turns `$$` into `$` and `$(NAME)` into a variable's value."""
    return text.replace("$", "$$")


def _replica(count: int, container: dict[str, object]) -> dict[str, object]:
    return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [container]}}}


def _yaml(value: object, indent: int) -> list[str]:
    """Block YAML for plain data: every string double-quoted (JSON's quoting, which YAML reads the same)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:")
                lines += _yaml(item, indent + 2)
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item:
                inner = _yaml(item, indent + 2)
                lines.append(f"{pad}- {inner[0].lstrip()}")
                lines += inner[1:]
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    return lines


def _scalar(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    # ASCII only: YAML readers fold U+0085 and U+2028 to line breaks and refuse DEL and C1 characters, all of
    # which JSON's \u escapes carry exactly (YAML reads a double-quoted JSON string the same). A character beyond
    # U+FFFF is YAML's \U escape: YAML readers take JSON's surrogate pair as two lone surrogates.
    text = json.dumps(str(value), ensure_ascii=False)
    return "".join(
        character
        if ord(character) < 0x7F
        else f"\\u{ord(character):04x}"
        if ord(character) <= 0xFFFF
        else f"\\U{ord(character):08x}"
        for character in text
    )
