"""`traceanalyzer query SQL`: SQL over the store's tables and views."""

import sys
from typing import Annotated

import typer

from ..report.terminal import query_table
from .common import StoreOpt, err, open_store, out


def query(sql: Annotated[str, typer.Argument(metavar="SQL", help="A query over the store's tables and views (see docs/schema.md).")],
          store: StoreOpt = None,
          csv: Annotated[bool, typer.Option("--csv", help="Write the result as CSV.")] = False,
          as_json: Annotated[bool, typer.Option("--json", help="Write the result as JSON (one array of objects).")] = False):
    """Run SQL against the store and print the result."""
    with open_store(store, read_only=True) as st:
        try:
            df = st.df(sql)
        except Exception as e:  # duckdb errors: show the message, not a traceback
            err.print(f"error: {str(e).splitlines()[0]}", markup=False)
            raise typer.Exit(2)
    if csv:
        df.to_csv(sys.stdout, index=False)
    elif as_json:
        sys.stdout.write(df.to_json(orient="records", date_format="iso", default_handler=str) + "\n")
    else:
        out.print(query_table(df))


def register(app: typer.Typer) -> None:
    app.command()(query)
