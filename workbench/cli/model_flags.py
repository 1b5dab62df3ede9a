"""`--model-options JSON`, the same flag in every command that builds a model
(`workbench launch`, `workbench ladder`, `workbench compress`): one help text, one parser,
the same problems in the same words.

    add_model_options_flag(group)                       # or default_text="the checkpoint's"
    options = parse_model_options(args.model_options, problems)

The text is strict JSON (`workbench.inputs.parse_json`: no duplicate key, no NaN, nested
at most `MAX_OPTIONS_DEPTH` deep) and must be an object of option names and values.
(`workbench export` takes its options one at a time, `--model-option KEY=VALUE`.) Pure:
imports no torch.
"""

from __future__ import annotations

import argparse
from typing import Any

from workbench.inputs import InputFileError, parse_json, typed

#: The flag's name.
FLAG = "--model-options"
#: The deepest --model-options JSON (options are flat; a list or two inside at most).
MAX_OPTIONS_DEPTH = 8


def add_model_options_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, default_text: str | None = None
) -> None:
    """Add `--model-options JSON` (text, default None). `default_text`: what applies when
    it is left out, said in its help ("the checkpoint's")."""
    text = "options of the model as a JSON object, e.g. '{\"layers\": 2}'"
    parser.add_argument(
        FLAG,
        default=None,
        metavar="JSON",
        help=text + (f" (default: {default_text})" if default_text else ""),
    )


def parse_model_options(text: str | None, problems: list[str]) -> dict[str, Any] | None:
    """`--model-options` text as a dict: None when the flag was left out, and None with a
    problem line ("--model-options [1]: must be a JSON object ...") appended to `problems`
    when it is no strict JSON object."""
    if text is None:
        return None
    try:
        options = parse_json(text, what=FLAG, max_depth=MAX_OPTIONS_DEPTH)
    except InputFileError as exc:
        problems.append(f"{FLAG} {typed(text)}: {exc.reason}")
        return None
    if not isinstance(options, dict):
        problems.append(f"{FLAG} {typed(text)}: must be a JSON object of option names and values")
        return None
    return options


__all__ = ["FLAG", "MAX_OPTIONS_DEPTH", "add_model_options_flag", "parse_model_options"]
