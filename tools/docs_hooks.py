"""MkDocs hook: pages that must not be hand-copied are generated when the site is built.

A page holds a marker line; the build replaces it with markdown made from the code itself:
  <!-- generated: cli-reference -->   every subcommand and flag, walked from the `stallscope` parser
  <!-- generated: knob-table -->      the PipelineConfig knobs, as `stallscope train --help` gives them
"""

from __future__ import annotations

import argparse
import html
import re

CLI_MARKER = "<!-- generated: cli-reference -->"
KNOB_MARKER = "<!-- generated: knob-table -->"


def _escape(text: str) -> str:
    """Help text as markdown: code spans kept, everything else escaped for a table cell."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", "\\|"))
        else:
            out.append(re.sub(r"([*_\[\]|\\])", r"\\\1", html.escape(part, quote=False)))
    return "".join(out)


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the order `--help` lists them."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((name, helps.get(name, ""), sub))
    return found


def _spellings(action: argparse.Action) -> list[str]:
    """The option strings, less the snake_case twin of one already listed (every flag has one)."""
    kept: list[str] = []
    for option in action.option_strings:
        if option.replace("_", "-") not in kept:
            kept.append(option)
    return kept


def documented_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The actions the reference lists for one parser: every argument and flag except hidden ones."""
    return [a for a in parser._actions
            if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction))
            and a.help is not argparse.SUPPRESS]


def _flag_table(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in documented_actions(parser):
        if action.option_strings:
            name = ", ".join(f"`{o}`" for o in _spellings(action))
            value = formatter._format_args(action, formatter._get_default_metavar_for_optional(action))
        else:
            name = f"`{formatter._get_default_metavar_for_positional(action)}`"
            value = formatter._format_args(action, formatter._get_default_metavar_for_positional(action))
        help_text = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {name} | {'`' + value + '`' if value else ''} | {_escape(help_text)} |")
    if not rows:
        return []
    return ["| flag | value | meaning |", "|---|---|---|", *rows, ""]


def _section(words: list[str], help_line: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    anchor = "-".join(words[1:]) or "stallscope"
    lines = [f"{'#' * level} `{' '.join(words)}` {{#{anchor}}}", ""]
    if help_line:
        lines += [_escape(help_line[0].upper() + help_line[1:]) + ".", ""]
    description = (parser.description or "").strip()
    if description and description != help_line:
        lines += ["```text", description, "```", ""]
    usage = " ".join(parser.format_usage().split())
    lines += ["```text", usage.removeprefix("usage: "), "```", ""]
    lines += _flag_table(parser)
    for name, sub_help, sub in _subparsers(parser):
        lines += _section(words + [name], sub_help, sub, min(level + 1, 4))
    return lines


def cli_reference() -> str:
    """Markdown for every subcommand (and its kinds, such as `serve worker`) and every flag."""
    from stallscope.cli.main import build_parser

    parser = build_parser()
    lines = ["Every flag also takes its `--snake_case` spelling (`--dataset_path` for `--dataset-path`), in "
             "`--name value` and `--name=value` forms. This page is generated from the parsers themselves "
             "each time the site is built.", ""]
    lines += ["| command | what it does |", "|---|---|"]
    lines += [f"| [`stallscope {name}`](#{name}) | {_escape(help_line)} |" for name, help_line, _ in _subparsers(parser)]
    lines.append("")
    usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
    lines += ["## `stallscope` {#stallscope}", "", "```text", usage, "```", "", *_flag_table(parser)]
    for name, help_line, sub in _subparsers(parser):
        lines += _section(["stallscope", name], help_line, sub, 2)
    return "\n".join(lines)


def knob_table() -> str:
    from stallscope.cli.train import knob_table as _knob_table

    return "\n".join(_knob_table())


def on_page_markdown(markdown: str, page=None, config=None, files=None) -> str:
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if KNOB_MARKER in markdown:
        markdown = markdown.replace(KNOB_MARKER, knob_table())
    return markdown
