"""Reports present findings; they compute nothing the rules did not."""

from .model import CheckResult, load_result

FORMATS = ("text", "json", "sarif", "junit")


def render(result: "CheckResult", fmt: str, **kw) -> str:
    if fmt == "json":
        from .json_report import render as r
    elif fmt == "sarif":
        from .sarif import render as r
    elif fmt == "junit":
        from .junit import render as r
    else:
        raise ValueError(f"unknown format {fmt!r}")
    return r(result, **kw)


__all__ = ["CheckResult", "load_result", "render", "FORMATS"]
