"""The problems of an export as data: `ExportProblem` (a bad argument, with the model
option it is about and how its value is written) and `ExportError` (every problem at once,
its text made from them). Re-exported by `workbench.export`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workbench.config import SettingProblem
from workbench.inputs import shown
from workbench.problems import listing


@dataclass(frozen=True)
class ExportProblem(SettingProblem):
    """A bad argument of an export, as data beyond (field, value, message):

    * `option`: the one model option it is about (field "model_options"; `value` is that
      option's): "model_options['hidden']=100000" ("model_options['seed']" when `value_text`
      is "");
    * `options`: several model options it is about, listed with their values (`value` a
      dict of them: "model_options hidden=60000, depth=2") or by name alone when
      `value_text` is "" ("model_options colour, size");
    * `value_text`: how the text writes the value (None: its repr; "": not at all);
    * `unset`: the TrainConfig setting the argument stands for when it is None (the text
      adds ", or None (config.NAME)").

    Each front end writes these parts its own way (the command line: `--model-option
    hidden=100000`, "(without it: --total-steps)"); `render` writes the Python names."""

    option: str | None = None
    options: tuple[str, ...] = ()
    value_text: str | None = None
    unset: str | None = None

    def render(
        self,
        name: Callable[[str], str] = str,
        value_text: str | None = None,
        sep: str = "=",
    ) -> str:
        """`field=value: message` as `SettingProblem.render`, with the model options after
        the field's name and the `unset` alternative after the message."""
        text = self.value_text if value_text is None else value_text
        subject = name(self.field)
        if self.option is not None:
            subject += f"[{shown(self.option)}]"
        elif self.options:
            if text == "" or not isinstance(self.value, dict):
                subject += " " + ", ".join(shown(k)[1:-1] for k in self.options)
            else:
                subject += " " + ", ".join(f"{k}={shown(self.value.get(k))}" for k in self.options)
            text = ""
        message = self.message + (f", or None (config.{self.unset})" if self.unset else "")
        plain = SettingProblem(subject, self.value, message)
        return plain.render(name=lambda n: n if n == subject else name(n), value_text=text, sep=sep)


class ExportError(ValueError):
    """Bad arguments to `export_deepspeed`; `problems` holds them as `SettingProblem`s
    (each naming the argument, the value and what is allowed), and the text is made from
    them."""

    def __init__(self, problems: Sequence[SettingProblem]) -> None:
        self.problems = tuple(problems)
        lines = [str(p) for p in self.problems]
        if len(lines) == 1:
            super().__init__(listing(lines, "cannot export", ""))
        else:  # "cannot export, N problems:" reads better than "N problems ..." here
            super().__init__("cannot export, " + listing(lines, "", "problems"))


__all__ = ["ExportError", "ExportProblem"]
