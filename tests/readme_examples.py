"""Runs a Markdown file's examples as a reader would, through Sybil: every Python block and every shell line.

How a block is read (the README and every page of the documentation site, docs/*.md, follow these rules;
`tests/unit/test_readme.py` runs the README's, `tests/unit/test_docs.py` every page's):

- ```python blocks run in document order in one namespace, like a notebook session, inside a scratch folder,
  on a machine made CPU-only (CUDA_VISIBLE_DEVICES=""). A full-line comment right under an expression statement
  is that expression's repr, compared as doctest does with ELLIPSIS (`...` matches anything).
- A block after `<!-- file: NAME -->` is that file: every such block, of this document and of the others it
  is read with (the README and the pages share their files), is written into the scratch folder before any
  example runs (so any command may use it), and a Python file is run as `python NAME` there: it must exit
  0, and the comment after a `print(...)` on the same line is a line it must print. A Python block with an
  `if __name__ == "__main__":` guard must be a file (a session has no `__main__` to guard).
- ```sh blocks: each line is a command, its `# comment` dropped, run in the scratch folder; it must exit 0, or N
  where its comment says "exits N". In a block whose lines start with `$ `, those are the commands, and the
  lines under each are what it prints (stdout and stderr together): a line `...` skips, and `...` inside a
  line matches anything. A `trainplan` line without shell syntax runs through `trainplan.cli.main` in this
  process (the console script itself is tested elsewhere); everything else runs through the shell, with this
  interpreter's scripts (`trainplan`, `torchrun`, `python`) first on PATH. Lines of programs in `SKIPPED`
  are not run, for the reason given there.
- A block that another test runs is named by one of its markers in `elsewhere` (marker → (test file, text that
  test reads the block by)); it is not run twice, and the check that the test still reads it is what runs. A
  command line equal to one of such a block's lines counts as that block's.
- Sybil's `<!-- skip: next if(cuda_devices < 2, reason="needs 2 GPUs") -->` is for a block that truly needs a
  GPU (`cuda_devices` is in the namespace: 0 here, since the machine is made CPU-only).
- ```pycon blocks are interactive sessions (`>>> ` prompts and what they print), run by doctest with ELLIPSIS in
  the same namespace.
- Fences other than python, pycon, sh, text or none are refused, so no code goes unrun.
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer
from sybil.parsers.markdown.skip import SkipParser

BIN = str(Path(sys.executable).parent)
LANGUAGES = ("python", "pycon", "sh")
TEXT_LANGUAGES = ("", "text")
SKIPPED = {
    "make": "make builds .venv and then runs the whole suite, this test included",
    "pip": "pip would change the environment the tests run in",
    "tests/cluster/engines.sh": "it installs Debian packages as root; .ci/run runs it before the suite",
}
MARKER = re.compile(r"^<!--\s*(?P<body>.*?)\s*-->$")
EXITS = re.compile(r"\bexits (\d+)\b")
SHELL_SYNTAX = re.compile(r"[|;&<>`$()*?\[\]{}]")
ROOT = Path(__file__).resolve().parents[1]

ELSEWHERE: dict[str, tuple[Path, str]] = {
    # The blocks other tests run, by the marker above them (the README's and the pages' alike).
    # The same script under torchrun, trainplan launch and tp.launch, each rank's line checked.
    "scaling-out:script": (ROOT / "tests/processes/test_one_world.py", '_readme_block("<!-- scaling-out:script -->")'),
    "scaling-out:commands": (
        ROOT / "tests/processes/test_one_world.py",
        '_readme_block("<!-- scaling-out:commands -->")',
    ),
    # The loop is tests/scripts/readme_loop.py (test_the_documented_loop_is_the_tested_script), run in one and two
    # processes there.
    "loop:start": (ROOT / "tests/processes/test_runtime_world.py", "readme_loop.train"),
    # The parallelize function is tests/scripts/mesh_world.py's (test_the_documented_parallelize_is_the_tested_one),
    # run in 4 processes by tests/processes/test_mesh_world.py.
    "mesh:parallelize": (ROOT / "tests/unit/test_docs.py", "def test_the_documented_parallelize_is_the_tested_one"),
    # The clusters page's real jobs (srun, mpirun, sbatch --wait), run as written by the cluster suite.
    "clusters:real-jobs": (ROOT / "tests/cluster/test_real_engines.py", 'page_jobs("<!-- clusters:real-jobs -->")'),
    # The CLI reference's examples are each subcommand's --help examples, run by that test.
    "cli-help:examples": (ROOT / "tests/unit/test_cli_help.py", "def test_every_example_runs_as_written"),
}


@dataclass(frozen=True)
class Block:
    """A fenced block: its language, its text, the line of its first text line, and the HTML-comment markers
    written right above its fence."""

    language: str
    source: str
    first_line: int
    markers: tuple[str, ...]

    @property
    def file(self) -> str | None:
        for marker in self.markers:
            if marker.startswith("file:"):
                return marker.removeprefix("file:").strip()
        return None


@dataclass
class Session:
    """What the examples of one document share: the scratch folder, and the blocks other tests run."""

    elsewhere: Mapping[str, tuple[Path, str]]
    name: str = "README"
    folder: Path | None = None
    elsewhere_lines: set[str] = field(default_factory=set)
    outputs_checked: int = 0
    commands_run: int = 0

    def prepare(self, document: Document, folder: Path, shared: Iterable[Document] = ()) -> None:
        """Write every file block (of `document`, then of the `shared` documents it is read with) into `folder`,
        and note the command lines that other tests run."""
        self.folder = folder
        for other in shared:
            for _, region in other.regions:
                if isinstance(region.parsed, Block) and region.parsed.file is not None:
                    (folder / region.parsed.file).write_text(region.parsed.source)
        for _, region in document.regions:
            block = region.parsed
            if not isinstance(block, Block):
                continue
            if block.file is not None:
                (folder / block.file).write_text(block.source)
            if block.language == "sh" and self._run_elsewhere(block) is not None:
                self.elsewhere_lines.update(command for command, _, _ in shell_commands(block.source))
        document.namespace["cuda_devices"] = 0

    def _run_elsewhere(self, block: Block) -> tuple[Path, str] | None:
        for marker in block.markers:
            if marker in self.elsewhere:
                return self.elsewhere[marker]
        return None

    @contextlib.contextmanager
    def inside(self) -> Iterator[Path]:
        """The scratch folder as the working directory, on a machine made CPU-only."""
        assert self.folder is not None, "prepare() the session first"
        previous_directory, previous_visible = Path.cwd(), os.environ.get("CUDA_VISIBLE_DEVICES")
        os.chdir(self.folder)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        try:
            yield self.folder
        finally:
            os.chdir(previous_directory)
            if previous_visible is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = previous_visible

    # -- evaluators ---------------------------------------------------------------------------------------

    def evaluate(self, example: Example) -> None:
        block = example.parsed
        assert isinstance(block, Block)
        if block.language not in LANGUAGES:
            raise AssertionError(
                f"line {block.first_line - 1}: a ```{block.language} block is never run; write ```python or ```sh "
                "(or ```text for output that is not code)"
            )
        elsewhere = self._run_elsewhere(block)
        if elsewhere is not None:
            path, needle = elsewhere
            assert needle in path.read_text(), f"{path.name} no longer runs this block (it lacks {needle!r})"
            return
        if block.language == "pycon":
            self._run_doctest(block, example.namespace)
        elif block.language == "python":
            if block.file is not None:
                self._run_script(block)
            else:
                self._run_in_session(block, example.namespace)
        elif block.file is None:  # a shell file (an env file, say) is written, not run
            self._run_shell(block)

    def _run_doctest(self, block: Block, namespace: dict[str, object]) -> None:
        """A ```pycon block: an interactive session, checked by doctest (ELLIPSIS on) in the session's namespace."""
        test = doctest.DocTestParser().get_doctest(block.source, namespace, self.name, self.name, block.first_line)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        report: list[str] = []
        with self.inside():
            runner.run(test, out=report.append, clear_globs=False)
        # doctest ran on a copy of the namespace: what the session defined is the document's, as a python block's is.
        namespace.update({name: value for name, value in test.globs.items() if name != "__builtins__"})
        self.outputs_checked += len(test.examples)
        assert test.examples and runner.failures == 0, f"line {block.first_line}: " + "".join(report)

    def _run_in_session(self, block: Block, namespace: dict[str, object]) -> None:
        assert "__main__" not in block.source, (
            f"line {block.first_line}: a block with an `if __name__ == '__main__':` guard is a script; "
            "mark it <!-- file: NAME.py --> so it runs as one"
        )
        lines = block.source.splitlines()
        tree = ast.parse(block.source)
        with self.inside():
            for statement in tree.body:
                end = statement.end_lineno or statement.lineno
                expected = _comment_under(lines, end) if isinstance(statement, ast.Expr) else None
                where = f"{self.name} line {block.first_line + statement.lineno - 1}"
                if isinstance(statement, ast.Expr) and expected is not None:
                    code = compile(ast.Expression(statement.value), where, "eval")
                    value = eval(code, namespace)
                    self.outputs_checked += 1
                    assert _matches(expected, repr(value)), f"{where}: shown {expected}, got {value!r}"
                else:
                    exec(compile(ast.Module([statement], type_ignores=[]), where, "exec"), namespace)
        namespace.pop("__builtins__", None)

    def _run_script(self, block: Block) -> None:
        assert block.file is not None
        with self.inside() as folder:
            result = subprocess.run(
                [sys.executable, block.file],
                cwd=folder,
                env=_environment(),
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
        assert result.returncode == 0, f"python {block.file} exited {result.returncode}:\n{result.stderr[-3000:]}"
        for line in block.source.splitlines():
            match = re.match(r"\s*print\(.*\)\s+#\s+(?P<shown>.+)$", line)
            if match:
                self.outputs_checked += 1
                printed = result.stdout.splitlines()
                shown = match["shown"]
                assert any(_matches(shown, item) for item in printed), f"{block.file} never printed {shown!r}"

    def _run_shell(self, block: Block) -> None:
        for command, comment, shown in shell_commands(block.source):
            program = command.split()[0]
            if program in SKIPPED or command in self.elsewhere_lines:
                continue
            exits = EXITS.search(comment)
            expected = int(exits.group(1)) if exits else 0
            code, printed = self._run_command(command)
            self.commands_run += 1
            assert code == expected, f"`{command}` exited {code}, {self.name} says {expected}:\n{printed[-3000:]}"
            lines = printed.splitlines()
            for line in shown:
                if line.strip() == "...":
                    continue
                self.outputs_checked += 1
                assert any(_matches(line, item) for item in lines), f"`{command}` never printed {line!r}:\n{printed}"

    def _run_command(self, command: str) -> tuple[int, str]:
        words = command.split()
        with self.inside() as folder:
            if words[0] == "trainplan" and words[1:2] != ["launch"] and not SHELL_SYNTAX.search(command):
                from trainplan.cli import main

                out = io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    try:
                        code = main(shlex.split(command)[1:])
                    except SystemExit as exit_:
                        code = exit_.code if isinstance(exit_.code, int) else 1
                return code, out.getvalue()
            result = subprocess.run(
                command,
                shell=True,
                cwd=folder,
                env=_environment(),
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
            return result.returncode, result.stdout + result.stderr


def _environment() -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("TRAINPLAN_", "SLURM_"))}
    environment.update(
        PATH=BIN + os.pathsep + environment.get("PATH", ""),
        CUDA_VISIBLE_DEVICES="",
        PET_LOCAL_ADDR="127.0.0.1",  # torchrun's rendezvous stays on loopback
    )
    return environment


def _comment_under(lines: list[str], end: int) -> str | None:
    """The full-line comment right under line `end` (1-based), without its `# `; None if there is none."""
    if end < len(lines) and lines[end].startswith("# "):
        return lines[end].removeprefix("# ").rstrip()
    return None


def _matches(shown: str, actual: str) -> bool:
    return doctest.OutputChecker().check_output(shown.rstrip() + "\n", actual.rstrip() + "\n", doctest.ELLIPSIS)


def split_comment(line: str) -> tuple[str, str]:
    """(command, comment): the comment starts at a `#` that begins a word outside quotes."""
    quote: str | None = None
    for index, char in enumerate(line):
        if quote is not None:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip(), line[index + 1 :].strip()
    return line.rstrip(), ""


def shell_commands(source: str) -> list[tuple[str, str, list[str]]]:
    """(command, comment, the lines shown under it) for each command of a ```sh block."""
    lines = source.splitlines()
    prompted = any(line.startswith("$ ") for line in lines)
    commands: list[tuple[str, str, list[str]]] = []
    for line in lines:
        if prompted and not line.startswith("$ "):
            if commands:
                commands[-1][2].append(line)
            continue
        command, comment = split_comment(line.removeprefix("$ "))
        if command:
            commands.append((command, comment, []))
    return commands


class BlockParser:
    """A Sybil parser: every fenced block becomes an example carrying a `Block` (text blocks excepted)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.lexer = FencedCodeBlockLexer(language=r"[^\n`]*", mapping={"language": "language", "source": "source"})

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in self.lexer(document):
            language = str(region.lexemes["language"]).strip()
            if language in TEXT_LANGUAGES:
                continue
            before = document.text[: region.start].splitlines()
            markers: list[str] = []
            while before and MARKER.match(before[-1].strip()):
                match = MARKER.match(before.pop().strip())
                assert match is not None
                markers.insert(0, match["body"])
            first_line = document.text.count("\n", 0, region.start) + 2
            block = Block(language, str(region.lexemes["source"]), first_line, tuple(markers))
            yield Region(region.start, region.end, block, self.session.evaluate)


def parse(path: Path, session: Session) -> Document:
    """The document's examples, in order: fenced blocks and Sybil's skip directives."""
    return Sybil(parsers=[BlockParser(session), SkipParser()]).parse(path)
