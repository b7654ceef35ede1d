"""MkDocs hooks for the documentation site (mkdocs.yml `hooks:`).

- The benchmark figures live where `make bench` writes them (benchmarks/figures/*.svg), outside docs/: the site
  serves them at the same path, so the benchmarks page shows them as the README used to.
- `<!-- api: trainplan.NAME -->` on a page becomes NAME's entry (signature and docstring, read from the object
  itself) where mkdocstrings cannot reach it: `trainplan.resolve`, the function, shares its name with the
  subpackage `trainplan.resolve`, which is what mkdocstrings' `::: trainplan.resolve` finds.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
API_ENTRY = re.compile(r"^<!-- api: (?P<module>[\w.]+)\.(?P<name>\w+) -->$", flags=re.MULTILINE)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for figure in sorted((ROOT / "benchmarks" / "figures").glob("*.svg")):
        files.append(
            File(
                figure.relative_to(ROOT).as_posix(),
                src_dir=str(ROOT),
                dest_dir=config.site_dir,
                use_directory_urls=config.use_directory_urls,
            )
        )
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return API_ENTRY.sub(_api_entry, markdown)


def _api_entry(match: re.Match[str]) -> str:
    module, name = match["module"], match["name"]
    value = getattr(importlib.import_module(module), name)
    signature = ", ".join(_parameter(module, parameter) for parameter in inspect.signature(value).parameters.values())
    returns = inspect.signature(value).return_annotation
    docstring = inspect.getdoc(value)
    if not docstring:
        raise ValueError(f"{module}.{name} has no docstring for the API reference")
    text = _examples_as_code(docstring)
    return f"### `{name}` {{ #{module}.{name} }}\n\n```python\n{name}({signature}) -> {returns}\n```\n\n{text}\n"


def _examples_as_code(docstring: str) -> str:
    """A docstring's Google-style `Examples:` section as mkdocstrings shows one: its prose, then each doctest
    session (`>>> ` lines and what they print) as a pycon block."""
    body, marker, section = docstring.partition("\nExamples:\n")
    if not marker:
        return docstring
    lines = [line.removeprefix("    ") for line in section.splitlines()]
    out: list[str] = ["", "**Examples:**", ""]
    in_session = False
    for line in lines:
        if line.startswith(">>> ") and not in_session:
            out.append("```pycon")
            in_session = True
        elif not line.strip() and in_session:
            out.append("```")
            in_session = False
        out.append(line)
    if in_session:
        out.append("```")
    return body + "\n" + "\n".join(out)


def _parameter(module: str, parameter: inspect.Parameter) -> str:
    """`name: annotation = default`, the annotation as written and a default that is a module's name by that name."""
    text = parameter.name
    if parameter.annotation is not inspect.Parameter.empty:
        text += f": {parameter.annotation}"
    if parameter.default is not inspect.Parameter.empty:
        owner = importlib.import_module(module)
        named = [key for key, item in vars(owner).items() if item is parameter.default and key.isupper()]
        text += f" = {named[0] if named else repr(parameter.default)}"
    return text
