"""Reports present findings; they compute nothing the rules did not.

`FORMATS` is the one list of the formats `check` and `scan` write: the CLI's `--format`
help and validation read it, and `render` finds each format's module in it."""

from importlib import import_module

from .model import CheckResult, load_result

# name -> the module of this package that renders it (text is printed: `text.print_result`)
FORMATS = {"text": "text", "json": "json_report", "sarif": "sarif", "junit": "junit"}


def render(result: "CheckResult", fmt: str, **kw) -> str:
    if fmt not in FORMATS or fmt == "text":
        raise ValueError(f"unknown format {fmt!r}" if fmt not in FORMATS else "the text format is printed: "
                         "report.text.print_result")
    return import_module(f"{__name__}.{FORMATS[fmt]}").render(result, **kw)


__all__ = ["CheckResult", "load_result", "render", "FORMATS"]
