"""The CLI reference page (docs/cli-reference.md), written from the parser itself: every subcommand's description,
usage, flags by group and examples (`trainplan.cli._parser` and `COMMAND_HELP`).

    python tools/cli_reference.py          # writes docs/cli-reference.md; tests/unit/test_docs.py fails when it differs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli-reference.md"
WIDTH = 88  # usage lines are wrapped at this width whatever the terminal


def render() -> str:
    from trainplan.cli import COMMAND_HELP, _parser

    parser = _parser()
    commands = _subcommands(parser)
    lines = [
        "# CLI reference",
        "",
        "Generated from the parser (`trainplan.cli._parser`; each command's description and examples are its",
        "`--help`'s, from `COMMAND_HELP`) by `python tools/cli_reference.py`: a test fails when this page differs.",
        "The [command line guide](cli.md) says how the commands fit together.",
        "",
        f"{parser.description} With no command, `trainplan` is `trainplan plan`; `--version` prints the version,",
        "and `--json` on any command makes its output, errors included, a JSON record.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    help_of = {action.dest: action.help for action in _subparsers_action(parser)._choices_actions}
    for name in commands:
        lines.append(f"| [`trainplan {name}`](#trainplan-{name}) | {_cell(help_of.get(name) or '')} |")
    for name, command in commands.items():
        description, examples = COMMAND_HELP[name]
        lines += ["", f"## trainplan {name}", "", description, "", "```text", _usage(command), "```"]
        for group in command._action_groups:
            actions = [action for action in group._group_actions if action.help is not argparse.SUPPRESS]
            actions = [action for action in actions if not isinstance(action, argparse._HelpAction)]
            if not actions:
                continue
            title = {"positional arguments": "arguments", "options": "options"}.get(group.title or "", group.title)
            lines += ["", f"**{title}**", "", "| flag | meaning |", "|---|---|"]
            lines += [f"| {_flag(action)} | {_meaning(action)} |" for action in actions]
        lines += ["", "Examples (each runs as written in `tests/unit/test_cli_help.py`):", ""]
        lines += ["<!-- cli-help:examples -->", "```sh", *examples, "```"]
    return "\n".join(lines) + "\n"


def _subparsers_action(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise LookupError("trainplan's parser has no subcommands")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return dict(_subparsers_action(parser).choices)


def _usage(command: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(prog=command.prog, width=WIDTH)
    formatter.add_usage(command.usage, command._actions, command._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    takes_value = action.nargs != 0
    metavar = ""
    if takes_value:
        if action.choices is not None and action.metavar is None:
            metavar = " {" + ",".join(map(str, action.choices)) + "}"
        else:
            metavar = f" {action.metavar or action.dest.upper()}"
    return ", ".join(f"`{option}{metavar}`" for option in action.option_strings)


def _meaning(action: argparse.Action) -> str:
    text = (action.help or "") % {"default": action.default, "prog": "trainplan"}
    if action.choices is not None and not action.option_strings:
        text += f" (one of {', '.join(f'`{choice}`' for choice in action.choices)})"
    if action.nargs != 0 and action.default not in (None, False, argparse.SUPPRESS, []):
        text += f" (default: `{action.default}`)"
    if isinstance(action, argparse._AppendAction):
        text += " (may be given more than once)"
    return _cell(text)


def _cell(text: str) -> str:
    """Text safe in a Markdown table cell: no pipes, tags or emphasis read into it."""
    for character, escaped in (("|", "\\|"), ("<", "&lt;"), (">", "&gt;"), ("*", "\\*")):
        text = text.replace(character, escaped)
    return " ".join(text.split())


def main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    PAGE.write_text(render())
    print(f"cli_reference: wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
