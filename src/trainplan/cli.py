"""The `trainplan` command (also `python -m trainplan`): plan, probe, matrix, migrate, gpus, env, launch.

`trainplan` with no subcommand is `trainplan plan`: it probes this machine and prints the plan for
an all-"auto" request with its explanation. Bad input prints the error's message (no traceback)
and exits 2. Every command but `launch` works without torch installed.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import functools
import io
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import attrs

from trainplan._version import __version__

# What only some subcommands run is imported in their functions: `trainplan plan` never imports the elastic
# launcher, the bug report, the emitters, the memory model, the legacy bridge, the --rules loader, the JSON wire
# format or python-dotenv, and builds only its own subcommand's flags (`_parser`).
from trainplan.effects.probing import probe
from trainplan.parse.fields import REQUEST_FIELD_ROWS
from trainplan.render.explain import memory_table
from trainplan.render.records import error_record, plain, problems_record, versioned
from trainplan.resolve import check, resolve
from trainplan.rules import ACCELERATORS as ACCELERATOR_RULES
from trainplan.rules import (
    BUILTIN_RULES,
    COUNTED_THROUGH,
    HOST_DEVICE,
    LAUNCH_CHOICES_VARIABLE,
    MAX_CPU_COUNT,
    MAX_DEVICES_PER_NODE,
    TORCHRUN_PROCESSES,
    AcceleratorRule,
    Rules,
)
from trainplan.rules import LAUNCHERS as LAUNCHER_RULES
from trainplan.rules.memory import WHAT_IF_PRECISION
from trainplan.spec.environment import Environment
from trainplan.spec.errors import InvalidRequest, TrainplanError, Unavailable, did_you_mean
from trainplan.spec.memory import MemoryPolicy
from trainplan.spec.names import (
    EMIT_FORMATS,
    NAMED_EMIT_FORMATS,
    START_METHODS,
    StartMethod,
)
from trainplan.spec.numbers import is_ascii_digits, whole_number
from trainplan.spec.options import options_text
from trainplan.spec.plan import Plan
from trainplan.spec.request import Request
from trainplan.spec.text import host_address

EXIT_USAGE = 2
DEFAULT_JOB_NAME = "train"
ENV_FILE_LIMIT = 1 << 20

SUBCOMMANDS = ("plan", "fit", "probe", "matrix", "migrate", "gpus", "env", "launch", "completion")
TOP_LEVEL_FLAGS = ("-h", "--help", "--version")


class CliError(TrainplanError):
    """A command-line input that cannot be used (an unknown --assume fact, an unreadable file)."""


class UsageError(CliError):
    """Words the command's parser refuses (an unknown flag, a flag without its value, a word where none goes), with
    the command that refused them and, for an unknown flag, the flags it takes and the closest one."""

    def __init__(
        self,
        *,
        command: str,
        reason: str,
        value: str | None = None,
        allowed: Sequence[str] = (),
        suggestion: str | None = None,
    ) -> None:
        self.command = command
        self.reason = reason
        self.value = value
        self.allowed = tuple(allowed)
        self.suggestion = suggestion
        hint = f" Did you mean {suggestion}?" if suggestion is not None else ""
        # No "trainplan:" of its own: the refusal's one line adds it ("trainplan: error: ...").
        super().__init__(f"{reason}.{hint} See `{command} --help`")


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose refusals are trainplan's errors: one line on stderr, or under `--json` the error
    record on stdout, exit code 2 either way (argparse's own would print its usage block and a second prefix)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(command=self.prog, reason=message)


def _unknown_words(parser: argparse.ArgumentParser, command: str | None, extra: list[str]) -> UsageError:
    """The refusal of words no flag of `command` takes: the first one, with the closest flag of that command."""
    if command is not None:
        parser = next(
            action.choices[command]
            for action in parser._actions  # argparse keeps its subcommands there
            if isinstance(action, argparse._SubParsersAction)
        )
    word = extra[0]
    if not word.startswith("-"):
        return UsageError(command=parser.prog, reason=f"{parser.prog} takes no argument {word!r}", value=word)
    flag = word.partition("=")[0]
    flags = sorted(
        option
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for option in action.option_strings
        if option.startswith("--")
    )
    return UsageError(
        command=parser.prog,
        reason=f"{parser.prog} has no flag {flag}",
        value=word,
        allowed=flags,
        suggestion=did_you_mean(flag, flags),
    )


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every subcommand with its flags, or (`command`) that subcommand's flags alone.

    A command runs one subcommand, so it builds only that one's flags (`_COMMAND_FLAGS`): the others are listed by
    name and help, as `trainplan --help` shows them, and filling theirs in would cost every run of the command."""
    parser = _Parser(
        prog="trainplan",
        description="Decide how a PyTorch training run is laid out on this machine (or a what-if one).",
        allow_abbrev=False,  # `trainplan launch x.py --v`: a script's word is never read as an abbreviated flag
    )
    parser.add_argument("--version", action="version", version=f"trainplan {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (summary, usage) in COMMAND_SUMMARIES.items():
        description, examples = COMMAND_HELP[name]
        subparser = commands.add_parser(
            name,
            help=summary,
            usage=usage,
            description=description,
            epilog="examples:\n" + "\n".join(f"  {example}" for example in examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            # `launch`: the script's own words (`--a 1` after it) must never match a flag's prefix
            allow_abbrev=name != "launch",
        )
        if command is None or command == name:
            _COMMAND_FLAGS[name](subparser)
    return parser


COMMAND_SUMMARIES: dict[str, tuple[str, str | None]] = {
    # Each subcommand's line in `trainplan --help`, and its usage line where argparse's own would mislead.
    "plan": ("resolve a request and print the plan (the default command)", None),
    "fit": (
        "which layout fits a model in the GPUs' memory, with the arithmetic (fit --params 7e9 --gpus 8x40GiB)",
        None,
    ),
    "launch": (
        "run a script on each of the plan's workers through torchrun's engine: trainplan launch [flags] train.py",
        "trainplan launch [flags] (script.py | -m module | --no-python program) [script arguments]",
    ),
    "probe": ("print the facts trainplan reads from this machine", None),
    "matrix": ("print the compatibility tables, generated from the rules", None),
    "migrate": ("translate old Trainer flags (--gpus 2 --accelerator ddp ...) to the modern request", None),
    "gpus": ("list visible GPUs: usable now or not, and why", None),
    "env": (
        "print a copy-paste block for bug reports: versions, driver and GPUs, facts, variables, packages",
        None,
    ),
    "completion": ("print the shell code that completes trainplan's commands", None),
}
"""The subcommands in `trainplan --help`'s order: each one's summary line and its usage (None: argparse's)."""


def _plan_flags(plan: argparse.ArgumentParser) -> None:
    _add_request_flags(plan)
    _add_environment_flags(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (Plan.to_dict)")
    _add_rules_flag(plan)
    plan.add_argument("--check", action="store_true", help="list every problem with the request, not just the first")
    plan.add_argument(
        "--emit",
        choices=EMIT_FORMATS,
        help="print the plan as a torchrun command line, an sbatch script or a Kubeflow PyTorchJob (script after --)",
    )
    plan.add_argument(
        "--image", default=None, help="--emit kubeflow: the container image (the script, torch, trainplan)"
    )
    plan.add_argument(
        "--job-name",
        default=None,
        help="--emit kubeflow and --emit slurm: the PyTorchJob's or the SLURM job's name (default: train)",
    )


def _launch_flags(launch: argparse.ArgumentParser) -> None:
    _add_request_flags(launch)
    _add_environment_flags(launch)
    _add_rules_flag(launch)
    _add_launch_flags(launch)
    launch.add_argument(
        "--json",
        action="store_true",
        help="a refusal as a JSON record on stdout (the workers' own output stays theirs)",
    )


def _probe_flags(probe_command: argparse.ArgumentParser) -> None:
    _add_environment_flags(probe_command)
    probe_command.add_argument("--json", action="store_true", help="print the facts as JSON")


def _matrix_flags(matrix: argparse.ArgumentParser) -> None:
    _add_rules_flag(matrix)
    matrix.add_argument("--json", action="store_true", help="print the tables as JSON")


def _migrate_flags(migrate: argparse.ArgumentParser) -> None:
    from trainplan.parse.legacy import LEGACY_FLAGS, MODERN_FLAGS

    old = migrate.add_argument_group("old and modern Trainer flags (as Request.from_legacy takes them)")
    for flag in LEGACY_FLAGS + MODERN_FLAGS:
        option = "--" + flag.replace("_", "-")
        if flag in ("auto_select_gpus", "move_metrics_to_cpu") or _flag_kind(flag) == "switch":
            old.add_argument(option, action="store_const", const=True, default=None)
        elif flag == "plugins":
            old.add_argument(option, action="append", default=None, metavar="NAME")
        elif _flag_kind(flag) != "options":
            old.add_argument(option, default=None, metavar="VALUE")
    migrate.add_argument("--json", action="store_true", help="print the modern request (and its notes) as JSON")


def _gpus_flags(gpus: argparse.ArgumentParser) -> None:
    gpus.add_argument("count", nargs="?", default=None, help="exit 2 unless at least this many are usable")
    gpus.add_argument("--json", action="store_true", help="print the GPUs as JSON")
    gpus.add_argument("--timeout", type=float, default=15.0, help="seconds a confirming probe may take")


def _env_flags(env: argparse.ArgumentParser) -> None:
    env.add_argument("--json", action="store_true", help="print the report as JSON")


def _completion_flags(completion: argparse.ArgumentParser) -> None:
    completion.add_argument("shell", choices=COMPLETION_SHELLS, help="the shell to complete in")
    completion.add_argument("--json", action="store_true", help="the shell code as the string field script of a record")


COMPLETION_SHELLS = ("bash", "zsh", "fish")

COMMAND_HELP: dict[str, tuple[str, tuple[str, ...]]] = {
    # Each subcommand's --help: what it does, and two examples (a test runs every one that starts no workers).
    "plan": (
        "Resolve a request on this machine (or a what-if one) and print the plan with the reason for each choice; "
        "--json for the plan as data, --check for every problem, --emit for a job that runs it.",
        (
            "trainplan plan --assume cuda=4 --devices 0,2 --precision bf16-mixed",
            "trainplan plan --assume cuda=4 --devices 4 --num-nodes 2 --emit slurm -- train.py --lr 0.1",
        ),
    ),
    "fit": (
        "Choose the layout that fits a model in the GPUs' memory (DDP, ZeRO, FSDP, HSDP, tensor parallelism, with "
        "or without activation checkpointing and offload), and show the arithmetic per device.",
        (
            "trainplan fit --params 7e9 --gpus 8x40GiB",
            "trainplan fit --params 1.3e9 --gpus 2x24GiB --strategy fsdp --json",
        ),
    ),
    "launch": (
        "Run a script on each of the plan's workers through torchrun's engine, with torchrun's spellings, "
        "restarts and log files, output prefixed by rank, and nothing left alive afterwards.",
        (
            "trainplan launch --accelerator cpu --devices 2 train.py --lr 0.1",
            "trainplan launch --num-nodes 2 --node-rank 0 --main-address node0 --main-port 29500 train.py",
        ),
    ),
    "probe": (
        "Print the facts trainplan reads from this machine: device counts, CPUs, start methods, packages and the "
        "launchers' variables.",
        ("trainplan probe", "trainplan probe --json --set-env SLURM_PROCID=0"),
    ),
    "matrix": (
        "Print the compatibility tables (strategies, precisions and mesh dimensions by accelerator), generated "
        "from the rule data.",
        ("trainplan matrix", "trainplan matrix --json"),
    ),
    "migrate": (
        "Translate old Trainer flags to the modern request: its Python spelling, trainplan plan's flags and a "
        "note for each old spelling.",
        ("trainplan migrate --gpus 2 --accelerator ddp", "trainplan migrate --tpu-cores 8 --json"),
    ),
    "gpus": (
        "List the visible GPUs, usable now or busy (and why, through NVML); with a count, exit 2 unless that "
        "many are usable.",
        ("trainplan gpus", "trainplan gpus --json --timeout 5"),
    ),
    "env": (
        "Print a copy-paste block for bug reports: versions, RAM, the driver and GPUs, the probe's facts, the "
        "variables that matter (secrets masked) and the optional packages.",
        ("trainplan env", "trainplan env --json"),
    ),
    "completion": (
        "Print the shell code that completes trainplan's commands and flags (through argcomplete); source it "
        "from the shell's startup file.",
        (
            'eval "$(trainplan completion bash)"',
            "trainplan completion fish > ~/.config/fish/completions/trainplan.fish",
        ),
    ),
}
"""The description and examples of each subcommand's --help."""


def _completion(shell: str) -> str:
    """The shell code that completes `trainplan` (argcomplete's, for this one executable)."""
    from argcomplete.shell_integration import shellcode

    return shellcode(["trainplan"], shell=shell)


def _flag_kind(name: str) -> str | None:
    """The kind of a request field's flag (`switch`, `value`, `options`), or None for another name."""
    return next((row.flag.kind for row in REQUEST_FIELD_ROWS if row.name == name and row.flag is not None), None)


def _add_rules_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rules",
        default=None,
        metavar="MODULE:NAME",
        help="a rule set to decide from instead of trainplan's own, e.g. myframework.trainplan_rules:RULES "
        "(a trainplan.Rules, built with BUILTIN_RULES.extend(...)); the module is imported with the current "
        "directory on sys.path, as python -m does",
    )


def _rules(arguments: argparse.Namespace) -> Rules:
    """The rule set `--rules module:NAME` names (imported, the current directory searched too), or the built-in one."""
    spelled: str | None = getattr(arguments, "rules", None)
    if spelled is None:
        return BUILTIN_RULES
    from trainplan.effects.rules_loading import load_rules

    try:
        return load_rules(spelled, from_working_directory=True)
    except InvalidRequest as error:
        raise CliError(f"--rules: {error}") from None


def _add_request_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("request (mirrors trainplan.Request)")
    for row in REQUEST_FIELD_ROWS:  # one flag per field that has one, as its row spells it
        flag = row.flag
        if flag is None:
            continue
        if flag.kind == "switch":
            group.add_argument(flag.option, action="store_true", help=flag.help)
        elif flag.kind == "options":
            group.add_argument(flag.option, action="append", default=[], metavar=flag.metavar, help=flag.help)
        else:
            action = group.add_argument(flag.option, default=flag.default, help=flag.help)
            if flag.words:  # what `trainplan completion`'s shell code offers after the flag (argcomplete reads it)
                action.completer = _Completer(flag.words)  # type: ignore[attr-defined]


@attrs.frozen
class _Completer:
    """An argcomplete completer: the words a flag takes (argcomplete calls it with its own keyword arguments)."""

    words: tuple[str, ...]

    def __call__(self, **_: object) -> tuple[str, ...]:
        return self.words


TORCHRUN_SPELLINGS: dict[str, tuple[str, str]] = {
    # torchrun's flag (and its underscore form): the option it fills, and trainplan's own spelling.
    "--nproc-per-node": ("nproc_per_node", "--devices"),
    "--nnodes": ("num_nodes_alias", "--num-nodes"),
    "--master-addr": ("master_addr", "--main-address"),
    "--master-port": ("master_port", "--main-port"),
}
"""torchrun's spellings of what trainplan's request and launch flags already say: accepted, with a note."""


def _add_launch_flags(parser: argparse.ArgumentParser) -> None:
    world = parser.add_argument_group("where this node meets the others (Fabric's spellings; torchrun's accepted)")
    world.add_argument("--node-rank", "--node_rank", default=None, help="this machine's rank among the nodes (0 first)")
    world.add_argument("--main-address", "--main_address", default=None, help="the address of node 0 (MASTER_ADDR)")
    world.add_argument("--main-port", "--main_port", default=None, help="a free port on node 0, the same everywhere")
    for flag, (dest, _) in TORCHRUN_SPELLINGS.items():
        underscored = "--" + flag[2:].replace("-", "_")
        spellings = (flag, underscored) if underscored != flag else (flag,)
        world.add_argument(*spellings, dest=dest, default=None, help=argparse.SUPPRESS)
    world.add_argument(
        "--standalone", action="store_true", help="one node meeting on a free port (the default for one node)"
    )
    engine = parser.add_argument_group("torchrun's engine (the same flags as torchrun)")
    engine.add_argument(
        "--max-restarts", "--max_restarts", type=int, default=0, help="restarts of the workers after a failure"
    )
    engine.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        default=None,
        help="c10d or static (default: c10d for one node, static for several)",
    )
    engine.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        default=None,
        help="host:port of the rendezvous (default: the main address and port)",
    )
    engine.add_argument("--rdzv-id", "--rdzv_id", default=None, help="the rendezvous id, the same on every node")
    engine.add_argument("--rdzv-conf", "--rdzv_conf", default="", help="rendezvous settings, key=value,...")
    engine.add_argument(
        "--local-addr", "--local_addr", default=None, help="this node's address for the c10d rendezvous"
    )
    engine.add_argument(
        "--log-dir", "--log_dir", default=None, help="keep each rank's stdout.log, stderr.log and error.json here"
    )
    engine.add_argument(
        "--redirects", "-r", default="0", help="to the log files only: 0 none, 1 stdout, 2 stderr, 3 both, or 0:3,1:1"
    )
    engine.add_argument("--tee", "-t", default="0", help="to the log files and the console (same values)")
    engine.add_argument(
        "--local-ranks-filter", "--local_ranks_filter", default=None, help="local ranks shown on the console, e.g. 0"
    )
    engine.add_argument(
        "--no-python", "--no_python", action="store_true", help="run the command as a program, not a Python script"
    )
    engine.add_argument("-m", "--module", action="store_true", help="run the script as a Python module (python -m)")
    run = parser.add_argument_group("the run")
    run.add_argument("--timeout", type=float, default=None, help="seconds for the whole run (default: none)")
    run.add_argument("--grace-period", type=float, default=5.0, help="seconds between terminate and kill")
    run.add_argument("--quiet", "-q", action="store_true", help="print nothing of trainplan's own before the workers")
    parser.add_argument("script", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def _add_fit_flags(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("the model (a Llama-like decoder, trained with Adam)")
    model.add_argument("--params", required=True, help="parameters, e.g. 7e9 or 7B")
    model.add_argument("--layers", type=int, default=None, help="decoder blocks (default: Llama's, hidden / 128)")
    model.add_argument("--hidden", type=int, default=None, help="hidden size (default: Llama's for --params)")
    model.add_argument("--sequence", type=int, default=4096, help="tokens per sample (default 4096)")
    model.add_argument("--batch-size", type=int, default=1, help="samples per GPU in one step (default 1)")
    model.add_argument(
        "--precision", default=WHAT_IF_PRECISION, help=f"the training precision (default {WHAT_IF_PRECISION})"
    )
    hardware = parser.add_argument_group("the GPUs (default: this machine's, probed)")
    hardware.add_argument("--gpus", default=None, metavar="NxSIZE", help="GPUs per node and their memory: 8x40GiB")
    hardware.add_argument("--nodes", type=int, default=1, help="nodes of that many GPUs (default 1)")
    hardware.add_argument("--host-memory", default=None, metavar="SIZE", help="each node's memory, e.g. 1TiB")
    hardware.add_argument("--package", action="append", default=[], help="an installed package, e.g. deepspeed")
    policy = parser.add_argument_group("the policy")
    policy.add_argument("--headroom", type=float, default=None, help="fraction of each GPU left free (default 0.1)")
    policy.add_argument("--no-checkpointing", action="store_true", help="do not recompute activations")
    policy.add_argument("--no-offload", action="store_true", help="keep everything on the GPUs")
    parser.add_argument("--strategy", default="auto", help="check this strategy instead of choosing one")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (its memory table included)")


def _add_environment_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("what-if facts (start from this machine unless --no-probe)")
    group.add_argument("--no-probe", action="store_true", help="start from a bare one-CPU machine, not this one")
    group.add_argument(
        "--assume",
        action="append",
        default=[],
        metavar="FACT",
        help=(
            "cuda=N, usable=0,2, mps[=yes|no], xla=N, cpu=N, interactive[=yes|no], cuda-initialized[=yes|no], "
            "start-methods=spawn,forkserver, package=NAME, gpu-memory=40GiB, host-memory=1TiB; "
            "with --rules, NAME=N for an accelerator the rule set adds"
        ),
    )
    group.add_argument(
        "--env-file", help="environment variables as a .env file (KEY=VALUE lines; export, quotes, comments)"
    )
    group.add_argument("--set-env", action="append", default=[], metavar="KEY=VALUE", help="an environment variable")


def _fail(message: str) -> NoReturn:
    raise CliError(message)


def _refuse(error: TrainplanError, json_wanted: bool) -> NoReturn:
    """A refused command: one line on stderr, or under `--json` the error record on stdout; exit code 2 either way."""
    if json_wanted and sys.stdout is not None:
        print(json.dumps(error_record(error, code=EXIT_USAGE), indent=2))
    else:
        print(f"trainplan: error: {error}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def _yes(fact: str, value: str | None) -> bool:
    if value is None or value.lower() in ("yes", "true", "1", "on"):
        return True
    if value.lower() in ("no", "false", "0", "off"):
        return False
    raise CliError(f"--assume {fact}={value}: write yes or no, e.g. --assume {fact}=no")


def _count(fact: str, value: str | None, limit: int = MAX_DEVICES_PER_NODE, what: str = "devices") -> int:
    """A count of `what` on one node, at most `limit` (no machine has more; its digits are never all read)."""
    if value is None:
        raise CliError(f"--assume {fact}: say how many, e.g. --assume {fact}=8")
    text = value.strip()
    number = whole_number(text)
    if number is None and not is_ascii_digits(text):
        raise CliError(f"--assume {fact}={value}: write a whole number, e.g. --assume {fact}=8")
    if number is None or number > limit:
        shown_value = text if len(text) <= 24 else f"{text[:12]}…({len(text)} digits)"
        raise CliError(
            f"--assume {fact}={shown_value}: a node has at most {limit} {what} to plan for; write a real count, "
            f"e.g. --assume {fact}=8"
        )
    return number


def _assume(env: Environment, assumption: str, downstream: tuple[str, ...] = ()) -> Environment:
    """`env` with one what-if fact; `downstream`: the accelerators a `--rules` rule set adds (NAME=N counts them)."""
    _, _, rest = assumption.partition("=")
    value = rest if "=" in assumption else None
    fact = _assumed_fact(assumption)
    # Each built-in accelerator is assumed by its name, through the fact its row counts it by.
    appliers: dict[str, Callable[[], Environment]] = {
        rule.name: functools.partial(_assume_accelerator, env, rule, fact, value) for rule in ACCELERATOR_RULES.values()
    }
    forked = {rule.start_method for rule in LAUNCHER_RULES.values() if rule.forks}
    appliers |= {
        "usable": lambda: attrs.evolve(env, usable_cuda_devices=_indices(fact, value)),
        "interactive": lambda: attrs.evolve(env, interactive=_yes(fact, value)),
        "cuda-initialized": lambda: attrs.evolve(env, cuda_initialized=_yes(fact, value)),
        "start-methods": lambda: attrs.evolve(env, start_methods=_methods(value)),
        "no-fork": lambda: attrs.evolve(env, start_methods=tuple(m for m in env.start_methods if m not in forked)),
        "package": lambda: attrs.evolve(env, packages={*env.packages, _package(value)}),
        # each visible CUDA device's memory (give it after cuda=N), and the host's
        "gpu-memory": lambda: attrs.evolve(
            env, cuda_memory_bytes=(_assumed_size(fact, value),) * env.cuda_device_count
        ),
        "host-memory": lambda: attrs.evolve(env, host_memory_bytes=_assumed_size(fact, value)),
    }
    for name in downstream:  # a downstream accelerator's devices: what its plugin would count
        appliers[name.replace("_", "-")] = functools.partial(
            lambda name: env.with_device_counts({name: _count(fact, value)}), name
        )
    if fact not in appliers:
        raise InvalidRequest(
            field="--assume", value=assumption, reason="it is not a known fact", allowed=tuple(appliers)
        )
    return appliers[fact]()


def _assumed_size(fact: str, value: str | None) -> int:
    from trainplan.parse.memory import parse_bytes

    size = None if value is None else parse_bytes(value)
    if size is None:
        raise CliError(f"--assume {fact}={value}: write a size, e.g. --assume {fact}=40GiB")
    return size


def _assume_accelerator(env: Environment, rule: AcceleratorRule, fact: str, value: str | None) -> Environment:
    """`env` with `rule`'s devices assumed: the fact its row counts them by (a count, or yes/no for a machine's one
    device); the host's CPUs by `cpu_count`. A new count forgets the usable-GPU probe's answer, and implies the
    package devices are counted through (`rules.COUNTED_THROUGH`)."""
    counted = rule.count_fact
    if counted is None:
        return attrs.evolve(env, cpu_count=max(1, _count(fact, value, MAX_CPU_COUNT, "CPUs")))
    changes: dict[str, Any] = {}  # Environment fields by name, as the row names its fact
    if isinstance(getattr(env, counted), bool):
        changes[counted] = _yes(fact, value)
        return attrs.evolve(env, **changes)
    changes[counted] = _count(fact, value)
    if rule.probes_usable:
        changes["usable_cuda_devices"] = None
    package = COUNTED_THROUGH.get(counted)
    if package is not None:
        changes["packages"] = {*env.packages, package}
    return attrs.evolve(env, **changes)


def _indices(fact: str, value: str | None) -> tuple[int, ...]:
    parts = [part.strip() for part in (value or "").split(",") if part.strip()]
    numbers = [whole_number(part) for part in parts]
    if any(number is None for number in numbers):
        raise CliError(f"--assume {fact}={value}: write device indices, e.g. --assume {fact}=0,2")
    return tuple(number for number in numbers if number is not None)


def _methods(value: str | None) -> tuple[StartMethod, ...]:
    chosen: list[StartMethod] = []
    for part in (value or "").split(","):
        name = part.strip()
        match = [method for method in START_METHODS if method == name]
        if not match:
            raise CliError(f"--assume start-methods={value}: start methods are {', '.join(START_METHODS)}")
        chosen.append(match[0])
    return tuple(chosen)


def _package(value: str | None) -> str:
    if not value or not value.strip():
        raise CliError("--assume package=NAME: name the package, e.g. --assume package=deepspeed")
    return value.strip()


def _read_env_file(path: Path) -> dict[str, str]:
    import dotenv.parser

    try:
        if not path.exists():
            raise CliError(f"--env-file {path}: cannot read it (no such file)")
        if not path.is_file():
            raise CliError(f"--env-file {path}: cannot read it: not a regular file (a FIFO or a device is never read)")
        if path.stat().st_size > ENV_FILE_LIMIT:
            raise CliError(f"--env-file {path}: larger than {ENV_FILE_LIMIT} bytes; an environment file is small")
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise CliError(f"--env-file {path}: cannot read it ({error.strerror})") from None
    except UnicodeDecodeError as error:
        raise CliError(f"--env-file {path}: it is not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    except ValueError as error:  # a path with a NUL byte, say
        raise CliError(f"--env-file {str(path)!r}: not a usable path ({error})") from None
    # Read as a .env file, by python-dotenv's parser: `export`, quotes, escapes and comments as a shell would
    # take them (`export X="a b" # note` is `a b`). `${VAR}` is kept as written: a what-if never reads this
    # machine's environment.
    variables: dict[str, str] = {}
    for binding in dotenv.parser.parse_stream(io.StringIO(text)):
        found = binding.original.string.strip()
        if binding.error or (binding.key is not None and binding.value is None):
            raise CliError(f"--env-file {path}, line {binding.original.line}: expected KEY=VALUE, found {found!r}")
        if binding.key is not None and binding.value is not None:
            variables[binding.key] = binding.value
    return variables


def _environment(arguments: argparse.Namespace) -> Environment:
    env = Environment() if arguments.no_probe else probe(rules=_rules(arguments))
    variables = _given_variables(arguments)
    if variables:
        env = env.with_variables(variables)
    downstream = _downstream_accelerators(arguments) if arguments.assume else ()
    # Memory per device last: it is given for the devices the other facts assume.
    for assumption in sorted(arguments.assume, key=lambda text: _assumed_fact(text) == "gpu-memory"):
        env = _assume(env, assumption, downstream)
    return env


def _downstream_accelerators(arguments: argparse.Namespace) -> tuple[str, ...]:
    """The accelerators `--rules` adds to trainplan's own: their devices are counted by `--assume NAME=N`."""
    if getattr(arguments, "rules", None) is None:
        return ()
    return tuple(name for name in _rules(arguments).accelerators if name not in BUILTIN_RULES.accelerators)


def _assumed_fact(assumption: str) -> str:
    """The fact an `--assume FACT[=VALUE]` names, as the appliers spell it."""
    return assumption.partition("=")[0].strip().lower().replace("_", "-")


def _resolved(request: Request, env: Environment, rules: Rules) -> Plan:
    """`resolve`, with the CLI's own spelling of the fix where a downstream accelerator has no devices."""
    try:
        return resolve(request, env, rules)
    except Unavailable as error:
        raise _cli_unavailable(error, rules) from None


def _cli_unavailable(error: Unavailable, rules: Rules) -> Unavailable:
    """`error`, or, when it asks for devices of an accelerator the rule set adds (counted by the framework's plugin,
    which the library's fix names), the same refusal with `--assume NAME=N`, how the CLI supplies that count."""
    for name in rules.accelerators:
        if name not in BUILTIN_RULES.accelerators and error.requested == f"accelerator={name!r}":
            return Unavailable(
                requested=error.requested,
                available=error.available,
                fix=f"Give the count its device plugin sees, e.g. --assume {name}=8 (trainplan cannot probe it), "
                "or use --accelerator auto",
            )
    return error


def _given_variables(arguments: argparse.Namespace) -> dict[str, str]:
    """The variables of --env-file, then --set-env (a later one wins)."""
    variables: dict[str, str] = {}
    if arguments.env_file is not None:
        if not arguments.env_file.strip():  # Path("") is ".", a directory: the path was left out
            raise CliError(
                f"--env-file {arguments.env_file!r}: no path given; name the .env file, e.g. --env-file slurm.env "
                "(or leave the flag out)"
            )
        variables.update(_read_env_file(Path(arguments.env_file)))
    for item in arguments.set_env:
        key, separator, value = item.partition("=")
        if not separator or not key.strip():
            raise CliError(f"--set-env {item!r}: write KEY=VALUE, e.g. --set-env SLURM_NTASKS=8")
        variables[key.strip()] = value
    return variables


def _request(arguments: argparse.Namespace) -> Request:
    rules = _rules(arguments)
    config: dict[str, object] = {}
    for row in REQUEST_FIELD_ROWS:
        if row.flag is not None:
            given = getattr(arguments, row.flag.dest)
            config[row.name] = _strategy_options(given) if row.flag.kind == "options" else given
    return Request.from_config(config, rules)


def _strategy_options(items: list[str]) -> dict[str, object] | None:
    if not items:
        return None
    options: dict[str, object] = {}
    for item in items:
        key, separator, text = item.partition("=")
        if not separator or not key.strip():
            raise CliError(f"--strategy-option {item!r}: write KEY=VALUE, e.g. --strategy-option stage=3")
        lowered = text.strip().lower()
        value: object = text.strip()
        number = whole_number(lowered, signed=True)  # dp_shard=-1: torchtitan's "auto"
        if lowered in ("true", "false"):
            value = lowered == "true"
        elif number is not None:
            value = number
        key = key.strip()
        if key in options:
            earlier = next(given for given in items if given.partition("=")[0].strip() == key)
            raise CliError(
                f"--strategy-option {earlier!r} and --strategy-option {item!r} both set {key}: give each option once"
            )
        options[key] = value
    return options


def _run_migrate(arguments: argparse.Namespace) -> int:
    from trainplan.parse.legacy import LEGACY_FLAGS, MODERN_FLAGS
    from trainplan.parse.plan_json import request_to_dict
    from trainplan.render.spelling import flag_spelling, python_spelling

    flags = {
        flag: getattr(arguments, flag)
        for flag in LEGACY_FLAGS + MODERN_FLAGS
        if _flag_kind(flag) != "options" and getattr(arguments, flag) is not None
    }
    if "plugins" in flags and isinstance(flags["plugins"], list) and len(flags["plugins"]) == 1:
        flags["plugins"] = flags["plugins"][0]
    request = Request.from_legacy(**flags)
    if arguments.json:
        print(json.dumps(versioned({"request": request_to_dict(request)}), indent=2))
        return 0
    print(python_spelling(request))
    flag_text = flag_spelling(request)
    print(f"trainplan plan {flag_text}".rstrip())
    if request.notes:
        print("notes:")
        for note in request.notes:
            print(f"  - {note}")
    return 0


def _run_launch(arguments: argparse.Namespace) -> int:
    from trainplan.effects.elastic import EngineOptions, end_on_late_signals, launch_script
    from trainplan.mapping.workers import script_request

    command = list(arguments.script)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise CliError(
            "nothing to launch: name the script after the flags, e.g. trainplan launch --devices 2 train.py "
            "(or -m package.module, or --no-python program)"
        )
    if arguments.timeout is not None and not (math.isfinite(arguments.timeout) and arguments.timeout > 0):
        raise CliError("--timeout must be a finite, positive number of seconds")
    if not (math.isfinite(arguments.grace_period) and arguments.grace_period >= 0):
        raise CliError("--grace-period must be a finite number of seconds ≥ 0")
    if arguments.max_restarts < 0:
        raise CliError("--max-restarts must be a whole number ≥ 0 (0: a failure ends the run)")
    counted = {name.replace("_", "-") for name in _downstream_accelerators(arguments)}
    for assumption in arguments.assume:
        if _assumed_fact(assumption) not in counted:
            raise CliError(
                f"--assume {assumption}: what-if facts cannot be run for real; trainplan launch starts the "
                "workers this machine has (only the devices of an accelerator --rules adds, which trainplan cannot "
                "probe, are given as --assume NAME=N). Use `trainplan plan --assume ...` for what-ifs"
            )
    _translate_torchrun_spellings(arguments)
    env = _environment(arguments)
    meeting = _meeting_variables(arguments)
    if meeting:
        env = env.with_variables({**env.variables, **meeting})
    rules = _rules(arguments)
    plan = _resolved(script_request(_request(arguments), rules), env, rules)
    if arguments.standalone and plan.num_nodes > 1:
        raise CliError(
            f"--standalone runs one node, and the plan has {plan.num_nodes}: drop --standalone, or ask for one node"
        )
    for note in plan.notes:
        if note.code == "script-strategy":
            print(f"trainplan: note: {note.message}", file=sys.stderr)
    options = EngineOptions(
        max_restarts=arguments.max_restarts,
        rdzv_backend=arguments.rdzv_backend,
        rdzv_endpoint=arguments.rdzv_endpoint,
        rdzv_id=arguments.rdzv_id,
        rdzv_conf=arguments.rdzv_conf,
        log_dir=arguments.log_dir,
        redirects=arguments.redirects,
        tee=arguments.tee,
        local_ranks_filter=arguments.local_ranks_filter,
        no_python=arguments.no_python,
        module=arguments.module,
        local_addr=arguments.local_addr,
    )
    ignore_late = end_on_late_signals()
    refused: list[TrainplanError] = []
    code = launch_script(
        plan,
        command,
        timeout=arguments.timeout,
        grace_period=arguments.grace_period,
        options=options,
        quiet=arguments.quiet,
        exit_on_signal_while_waiting=True,
        # The plan was made from the given variables: the workers get them too, and which request fields the flags
        # wrote (a default value included), so that a script's own Request takes those.
        variables={**_given_variables(arguments), LAUNCH_CHOICES_VARIABLE: ",".join(_written_fields(arguments))},
        refused=refused if getattr(arguments, "json", False) else None,
    )
    ignore_late()  # the code is decided: a signal from here on changes nothing
    for error in refused:  # found at the rendezvous (the nodes' plans differ): the record, as for any refusal
        print(json.dumps(error_record(error, code=code), indent=2))
    return code


def _written_fields(arguments: argparse.Namespace) -> list[str]:
    """The request fields whose flags this command line wrote before the script (`--precision 32-true` too)."""
    words: list[str] = list(getattr(arguments, "words", []))
    flags = words[: len(words) - len(arguments.script)] if arguments.script else words
    return [
        row.name
        for row in REQUEST_FIELD_ROWS
        if row.flag is not None
        and any(word == row.flag.option or word.startswith(row.flag.option + "=") for word in flags)
    ]


def _translate_torchrun_spellings(arguments: argparse.Namespace) -> None:
    """torchrun's spellings fill trainplan's flags, with a note naming trainplan's; both at once must agree."""
    for flag, (dest, ours) in TORCHRUN_SPELLINGS.items():
        given = getattr(arguments, dest)
        if given is None:
            continue
        target, value = ours[2:].replace("-", "_"), given
        hint = ""
        if dest == "nproc_per_node":
            value, hint = _nproc_per_node(arguments, given)
        elif dest == "num_nodes_alias" and flag == "--nnodes" and ":" in given:
            raise CliError(
                f"--nnodes {given}: trainplan plans a fixed number of nodes; write --num-nodes N (for an elastic "
                "range of nodes, run torchrun itself)"
            )
        default = {"devices": "auto", "num_nodes": "auto"}.get(target)
        current = getattr(arguments, target)
        if current not in (None, default) and str(current) != str(value):
            raise CliError(f"{flag} {given} and {ours} {current} disagree: give one of them")
        setattr(arguments, target, value)
        print(f"trainplan: note: {flag} is torchrun's spelling; trainplan's is {ours}{hint}", file=sys.stderr)


def _nproc_per_node(arguments: argparse.Namespace, given: str) -> tuple[str, str]:
    """torchrun's --nproc-per-node (a count, gpu, cpu or auto) as trainplan's --devices, with the hint."""
    word = given.strip().lower()
    hint = " (a count, -1 for every visible GPU, or GPU indices such as 0,2)"
    named = TORCHRUN_PROCESSES.get(word)
    if named is not None:
        if named.overrides_asked or arguments.accelerator == "auto":
            arguments.accelerator = named.accelerator
        if named.per_host_cpu:
            count = str(os.cpu_count() or 1)
            return count, f": --accelerator {named.accelerator} --devices {count} ({named.explained}){hint}"
        return "-1", f": --devices -1 ({named.explained}){hint}"
    if word == "auto":  # torchrun's auto: every device of the accelerator, or one process per CPU without one
        env = _environment(arguments)
        trial = _resolved(Request.from_config({"accelerator": arguments.accelerator}), env, _rules(arguments))
        if trial.device_type == HOST_DEVICE:
            count = str(env.cpu_count)
            return (
                count,
                f": --devices {count} (one process per CPU, as torchrun's auto on a machine without GPUs){hint}",
            )
        return "-1", f": --devices -1 (every visible {trial.accelerator} device, as torchrun's auto){hint}"
    if whole_number(word) is None:
        raise CliError(f"--nproc-per-node {given}: write a number of processes, gpu, cpu or auto (or --devices N)")
    return word, f": --devices {word}{hint}"


def _meeting_variables(arguments: argparse.Namespace) -> dict[str, str]:
    """--node-rank, --main-address and --main-port (or --rdzv-endpoint) as the variables the resolver reads."""
    variables: dict[str, str] = {}
    if arguments.node_rank is not None:
        if whole_number(str(arguments.node_rank).strip()) is None:
            raise CliError(f"--node-rank {arguments.node_rank}: write this machine's rank, 0 for the first node")
        variables["NODE_RANK"] = str(arguments.node_rank).strip()
    address, port = arguments.main_address, arguments.main_port
    address_flag, port_flag = "--main-address", "--main-port"
    if arguments.rdzv_endpoint:
        host, separator, endpoint_port = str(arguments.rdzv_endpoint).rpartition(":")
        if not separator or not host:
            raise CliError(f"--rdzv-endpoint {arguments.rdzv_endpoint}: write host:port, e.g. node0:29400")
        if address is None:
            address, address_flag = host.strip("[]"), f"--rdzv-endpoint {arguments.rdzv_endpoint}: the host"
        if port is None:
            port, port_flag = endpoint_port, f"--rdzv-endpoint {arguments.rdzv_endpoint}: the port"
    if address is not None:
        if host_address(str(address)) is None:
            raise CliError(f"{address_flag} {address!r}: write the host name or IP address of node 0")
        variables["MASTER_ADDR"] = str(address)
    if port is not None:
        number = whole_number(str(port).strip())
        if number is None or not 0 < number < 65536:
            raise CliError(f"{port_flag} {port}: write a free TCP port (1-65535), the same on every node")
        variables["MASTER_PORT"] = str(number)
    return variables


def _run_plan(arguments: argparse.Namespace, command: list[str]) -> int:
    if arguments.emit and (arguments.json or arguments.check):
        given = "--json" if arguments.json else "--check"
        raise CliError(f"{given} and --emit {arguments.emit} print different things: give one of them")
    env = _environment(arguments)
    if arguments.check:
        problems: list[TrainplanError]
        try:
            request = _request(arguments)
        except TrainplanError as error:
            problems = [error]
        else:
            rules = _rules(arguments)
            problems = [
                _cli_unavailable(problem, rules) if isinstance(problem, Unavailable) else problem
                for problem in check(request, env, rules)
            ]
        code = EXIT_USAGE if problems else 0
        if arguments.json:
            print(json.dumps(problems_record(list(problems), code=code), indent=2))
            return code
        for problem in problems:
            print(f"- {problem}")
        if not problems:
            print("no problems: the request resolves on this environment")
        return code
    if arguments.job_name is not None and arguments.emit not in NAMED_EMIT_FORMATS:
        emitted = f"--emit {arguments.emit}" if arguments.emit else "a plan"
        raise CliError(
            f"--job-name {arguments.job_name}: {emitted} has no job name to set (it names the job of "
            f"{' and '.join(f'--emit {form}' for form in NAMED_EMIT_FORMATS)}): drop --job-name, or emit one of those"
        )
    name = DEFAULT_JOB_NAME if arguments.job_name is None else arguments.job_name
    request = _request(arguments)
    rules = _rules(arguments)
    if arguments.emit:
        from trainplan.mapping.workers import script_request

        # The emitted job runs a script on every worker, whatever this session is.
        request, env = script_request(request, rules), attrs.evolve(env, interactive=False)
    plan = _resolved(request, env, rules)
    _note_unused_memory(arguments, request)
    if arguments.emit in ("torchrun", "slurm") and not command:  # (kubeflow's emitter refuses it with its own fix)
        raise CliError(
            f"--emit {arguments.emit} writes a job that runs a script, and none was named: write it after --, "
            f"e.g. trainplan plan --emit {arguments.emit} -- train.py --lr 0.1"
        )
    if arguments.emit == "torchrun":
        from trainplan.render.emit import emit_torchrun

        print(emit_torchrun(plan, command))
    elif arguments.emit == "slurm":
        from trainplan.render.emit import emit_slurm

        print(emit_slurm(plan, command, rules=rules, name=name))
    elif arguments.emit == "kubeflow":
        if arguments.image is None:
            raise CliError(
                "--emit kubeflow needs --image: the container image that holds the script, torch and trainplan"
            )
        from trainplan.render.emit import emit_kubeflow

        print(emit_kubeflow(plan, command, image=arguments.image, name=name, rules=rules))
    elif arguments.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(plan.explain())
    return 0


MEMORY_FACTS = ("gpu-memory", "host-memory")
"""The `--assume` facts only a model's facts read: the memory-aware choice fits a model to them."""


def _note_unused_memory(arguments: argparse.Namespace, request: Request) -> None:
    """`plan --assume gpu-memory=40GiB` with no model: the memory changes nothing, so say so (on stderr, leaving
    --json and --emit clean) and where it is read."""
    assumed = [text for text in arguments.assume if _assumed_fact(text) in MEMORY_FACTS]
    if assumed and request.model is None:
        print(
            f"trainplan: note: --assume {' --assume '.join(assumed)} is used only with a model's facts, and `plan` "
            "has none: fit a model to that memory with `trainplan fit --params 7e9 --gpus 8x40GiB` (or "
            "Request(model=...) in Python)",
            file=sys.stderr,
        )


def _size(flag: str, text: str) -> int:
    from trainplan.parse.memory import parse_bytes

    size = parse_bytes(text)
    if size is None:
        raise CliError(f"{flag} {text}: write a size such as 40GiB, 80GB or 512MiB")
    return size


def _fit_environment(arguments: argparse.Namespace) -> Environment:
    env = probe()
    if arguments.gpus is not None:
        count, times, size = arguments.gpus.replace("×", "x").partition("x")
        number = whole_number(count.strip())
        if not times or number is None or not 0 < number <= MAX_DEVICES_PER_NODE:
            raise CliError(f"--gpus {arguments.gpus}: write GPUs per node × their memory, e.g. --gpus 8x40GiB")
        # a what-if's nodes: their host memory is --host-memory's, not this machine's
        env = attrs.evolve(env, cuda_device_count=number, usable_cuda_devices=None, host_memory_bytes=None)
        env = attrs.evolve(env, cuda_memory_bytes=(_size("--gpus", size),) * number)
    if arguments.host_memory is not None:
        env = attrs.evolve(env, host_memory_bytes=_size("--host-memory", arguments.host_memory))
    return attrs.evolve(env, packages={*env.packages, *arguments.package})


def _run_fit(arguments: argparse.Namespace) -> int:
    from trainplan.parse.memory import parse_count
    from trainplan.resolve.memory import MAX_SHAPE, transformer_facts

    parameters = parse_count(arguments.params)  # 7e9, 7000000000, 7B, 1.3B, 350M
    if parameters is None or parameters > MAX_SHAPE:
        raise CliError(
            f"--params {arguments.params}: write the parameter count, e.g. --params 7e9 or --params 7B (at most 1e15)"
        )
    precision = Request.from_config({"precision": arguments.precision}).precision
    for flag, value in (
        ("--layers", arguments.layers),
        ("--hidden", arguments.hidden),
        ("--sequence", arguments.sequence),
        ("--batch-size", arguments.batch_size),
    ):
        if value is not None and not 1 <= value <= MAX_SHAPE:
            raise CliError(f"{flag} {value}: write a whole number from 1 to {MAX_SHAPE:.0e}")
    facts = transformer_facts(
        parameters=parameters,
        layers=arguments.layers,
        hidden=arguments.hidden,
        sequence=arguments.sequence,
        batch_size=arguments.batch_size,
        precision=precision,  # type: ignore[arg-type]  # normalised by from_config
    )
    defaults = BUILTIN_RULES.memory_policy
    policy = MemoryPolicy(
        headroom=defaults.headroom if arguments.headroom is None else arguments.headroom,
        activation_checkpointing=not arguments.no_checkpointing,
        offload=not arguments.no_offload,
    )
    request = Request.from_config(
        {"strategy": arguments.strategy, "num_nodes": arguments.nodes, "precision": precision}
    )
    env = _fit_environment(arguments)
    if arguments.nodes > 1 and not env.variables.get("MASTER_ADDR"):
        env = env.with_variables({"MASTER_ADDR": "node-0", "MASTER_PORT": "29500", "NODE_RANK": "0"})
    plan = _resolved(attrs.evolve(request, model=facts, memory_policy=policy), env, BUILTIN_RULES)
    if plan.memory is None and "memory-unknown" in {note.code for note in plan.notes}:
        # a fit without the GPUs' memory is no answer: the strategy chosen as if there were no model
        raise CliError(
            f"fit --params {arguments.params}: the GPUs' memory is not known (this machine shows "
            f"{env.cuda_device_count} CUDA GPU(s) and no memory for them), so nothing can be fitted to it: pass the "
            "GPUs as --gpus NxSIZE, e.g. --gpus 8x40GiB"
        )
    if arguments.json:
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    print(
        f"model: {facts.parameter_count:,} parameters, {facts.layer_count} layers, sequence {arguments.sequence}, "
        f"batch {facts.batch_size} per GPU, {precision}"
    )
    if plan.memory is None:
        print(f"strategy: {plan.strategy.name} (memory not checked: no arithmetic for strategy {plan.strategy.name!r})")
        return 0
    chosen = plan.memory.estimate
    ckpt = " with activation checkpointing" if chosen is not None and chosen.checkpointing else ""
    options = "" if plan.strategy.options is None else f" {options_text(plan.strategy.options)}"
    print(f"choice: {plan.strategy.name}{options}{ckpt} on {plan.world_size} GPU(s)")
    print("\n".join(memory_table(plan.memory)))
    return 0


def _run_gpus(arguments: argparse.Namespace) -> int:
    from trainplan.effects.gpus import gpu_statuses

    wanted: int | None = None
    if arguments.count is not None:
        counted = whole_number(str(arguments.count))
        if counted is None:
            raise CliError(f"trainplan gpus {arguments.count}: give a whole number of GPUs, e.g. trainplan gpus 2")
        wanted = counted
    if not (math.isfinite(arguments.timeout) and arguments.timeout > 0):
        raise CliError("--timeout must be a finite, positive number of seconds")
    statuses = gpu_statuses(timeout=arguments.timeout)
    usable = [status for status in statuses if status.usable]
    short = wanted is not None and len(usable) < wanted
    if arguments.json and short:  # one JSON document on stdout: the refusal's record
        _fail(f"asked for {wanted} usable GPU(s), but {len(usable)} of {len(statuses)} visible are usable")
    if arguments.json:
        print(json.dumps(versioned({"gpus": [plain(attrs.asdict(status)) for status in statuses]}), indent=2))
    elif not statuses:
        print("no visible CUDA GPU")
    else:
        for status in statuses:
            memory = "?" if status.memory_total is None else f"{status.memory_total / 2**30:.1f} GiB"
            used = "" if status.memory_used is None else f", {status.memory_used / 2**30:.1f} GiB used"
            verdict = "usable" if status.usable else f"busy: {status.reason}"
            print(f"{status.index}  {status.name or status.uuid}  ({memory}{used})  {verdict}  [{status.checked_by}]")
    if short:
        _fail(f"asked for {wanted} usable GPU(s), but {len(usable)} of {len(statuses)} visible are usable")
    return 0


def _run_env(arguments: argparse.Namespace) -> int:
    from trainplan.effects.report import bug_report
    from trainplan.render.report import render_report, report_to_dict

    report = bug_report()
    print(json.dumps(versioned(report_to_dict(report)), indent=2) if arguments.json else render_report(report))
    return 0


def _run_probe(arguments: argparse.Namespace) -> int:
    env = _environment(arguments)
    facts = {attribute.name: _jsonable(getattr(env, attribute.name)) for attribute in attrs.fields(Environment)}
    if arguments.json:
        print(json.dumps(versioned(facts), indent=2))
    else:
        width = max(len(name) for name in facts)
        for name, value in facts.items():
            print(f"{name.ljust(width)}  {value}")
    return 0


def _jsonable(value: object) -> object:
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "items"):
        return dict(value.items())
    return value


_COMMAND_FLAGS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "plan": _plan_flags,
    "fit": _add_fit_flags,
    "launch": _launch_flags,
    "probe": _probe_flags,
    "matrix": _matrix_flags,
    "migrate": _migrate_flags,
    "gpus": _gpus_flags,
    "env": _env_flags,
    "completion": _completion_flags,
}
"""What each subcommand's flags are added by (`_parser` fills in the running command's alone)."""


_OUTPUT_ERRORS = "trainplan-original-bytes"


def _original_bytes(error: UnicodeError) -> tuple[str | bytes, int]:
    """The CLI's output error handler: a byte the operating system gave undecoded (an argument or file name that
    is not UTF-8, held as a surrogate escape) is written back as that byte, so an emitted line runs the very word
    it was given; any other character the stream cannot encode is written as a backslash escape."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    bad = error.object[error.start : error.end]
    if all("\udc80" <= character <= "\udcff" for character in bad):
        return bytes(ord(character) - 0xDC00 for character in bad), error.end
    return codecs.backslashreplace_errors(error)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `trainplan` console script."""
    codecs.register_error(_OUTPUT_ERRORS, _original_bytes)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if callable(reconfigure):  # a value that the terminal's encoding cannot show is escaped, not fatal
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors=_OUTPUT_ERRORS)
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions (`trainplan completion`): answer, exit
        import argcomplete

        argcomplete.autocomplete(_parser())
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C anywhere in a command: one line, the shell's code for it
        with contextlib.suppress(OSError, ValueError):
            print("trainplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`trainplan matrix | head`): stop quietly, as other command-line tools do.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except OSError as error:  # stdout is /dev/full, or closed
        with contextlib.suppress(OSError, ValueError, AttributeError):
            print(f"trainplan: error: cannot write the output ({error.strerror or error})", file=sys.stderr)
        return EXIT_USAGE


def _main(argv: Sequence[str] | None) -> int:
    arguments_list = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in arguments_list and arguments_list[:1] != ["launch"]:  # launch reads its script itself
        split = arguments_list.index("--")
        arguments_list, command = arguments_list[:split], arguments_list[split + 1 :]
    # Before the words are parsed, `--json` anywhere asks for records (for launch: before its `--`); once they are,
    # the parsed flag says (a launched script's own `--json` is the script's).
    words = arguments_list[: arguments_list.index("--")] if "--" in arguments_list else arguments_list
    wanted = {"json": any(word == "--json" or word.startswith("--json=") for word in words)}
    try:
        return _command(arguments_list, command, wanted)
    except TrainplanError as error:
        _refuse(error, wanted["json"])


def _command(arguments_list: list[str], command: list[str], wanted: dict[str, bool]) -> int:
    if arguments_list and set(arguments_list) <= {"--version", "--json"} and "--version" in arguments_list:
        # `trainplan --version --json` (either order): the version as a record
        print(
            json.dumps(versioned({"trainplan": __version__}), indent=2)
            if wanted["json"]
            else f"trainplan {__version__}"
        )
        return 0
    leading = next((index for index, word in enumerate(arguments_list) if word != "--json"), len(arguments_list))
    if 0 < leading < len(arguments_list) and arguments_list[leading] in SUBCOMMANDS:
        # `trainplan --json plan ...`: a global-looking --json before the command is the command's own flag
        arguments_list[: leading + 1] = [arguments_list[leading], "--json"]
    first = arguments_list[leading] if leading < len(arguments_list) else None
    if first is not None and not first.startswith("-") and first not in SUBCOMMANDS:
        guess = did_you_mean(first, SUBCOMMANDS)
        raise UsageError(
            command="trainplan",
            reason=f"there is no command {first!r}; the commands are {', '.join(SUBCOMMANDS)}",
            value=first,
            allowed=SUBCOMMANDS,
            suggestion=None if guess is None else f"`trainplan {guess}`",
        )
    if not arguments_list or (arguments_list[0] not in SUBCOMMANDS and arguments_list[0] not in TOP_LEVEL_FLAGS):
        arguments_list.insert(0, "plan")
    running = arguments_list[0] if arguments_list[0] in SUBCOMMANDS else None  # None: `--help`, `--version`
    parser = _parser(running)
    arguments, extra = parser.parse_known_args(arguments_list)
    if extra:
        raise _unknown_words(parser, arguments.command, extra)
    arguments.words = arguments_list  # what was written, as written (`launch` passes on the flags it was given)
    wanted["json"] = bool(getattr(arguments, "json", False))
    # Started with stdout closed (`>&-`): say so. A launch too, before any worker starts: what its workers print would
    # be dropped without a word for the whole run (`>/dev/null` says that is wanted).
    if sys.stdout is None:
        raise CliError("stdout is closed: nothing could be written (give the command somewhere to write)")
    if arguments.command == "probe":
        return _run_probe(arguments)
    if arguments.command == "matrix":
        from trainplan.render.matrix import matrix_record, render_matrix

        rules = _rules(arguments)
        print(json.dumps(versioned(matrix_record(rules)), indent=2) if arguments.json else render_matrix(rules))
        return 0
    if arguments.command == "migrate":
        return _run_migrate(arguments)
    if arguments.command == "gpus":
        return _run_gpus(arguments)
    if arguments.command == "fit":
        return _run_fit(arguments)
    if arguments.command == "env":
        return _run_env(arguments)
    if arguments.command == "completion":
        script = _completion(arguments.shell)
        print(
            json.dumps(versioned({"shell": arguments.shell, "script": script}), indent=2) if arguments.json else script
        )
        return 0
    if arguments.command == "launch":
        from trainplan.effects.extras import require_torch

        require_torch("trainplan launch")  # its workers join a torch process group; the planning commands need none
        return _run_launch(arguments)
    if command and not arguments.emit:
        raise CliError(f"unexpected arguments after --: {' '.join(command)} (they are for --emit or launch)")
    return _run_plan(arguments, command)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
