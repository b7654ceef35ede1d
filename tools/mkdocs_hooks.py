"""MkDocs hooks for the documentation site (mkdocs.yml `hooks:`).

The benchmark figures live where `make bench` writes them (benchmarks/figures/*.svg), outside docs/: the site serves
them at the same path, so the benchmarks page shows them as the README used to (`benchmarks/figures/NAME.svg`).
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]


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
