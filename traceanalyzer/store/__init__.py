"""The DuckDB store: the schema, and the one place that writes it.

A run is written in one transaction (all of its rows or none), keyed by a hash of the
file's bytes, so ingesting the same content again replaces the run instead of adding a
second copy. A reader that streams (nsys) hands its tables, in parts, to a `RunWriter`
while it reads, so a big run is never whole in memory; the transaction is begun at the
first part (the run id waits for the file's hash) and committed, or rolled back, at the
end (`writer.py`).

DuckDB lets one process at a time open the file for writing, and none read it meanwhile. A
process that finds it locked waits: a writer waits for another writer up to `lock_timeout_s`
and then fails with a message that says so, and for readers as long as they hold it; a
reader waits as long as it takes (unless TRACEANALYZER_LOCK_TIMEOUT_S is set). While it
waits, it says so in a file next to the store (`WAITING_SUFFIX`), and a writer that can let
go between two transactions (a scan's, between two runs: `Store.let_in_waiting`) closes the
store for it, then opens it again when the other is done.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from .. import os_memory, schema
from ..interrupt import interruptible
from ..ingest.base import ParsedTrace
from ..resources import MemoryLimitError, Resources, connect_duckdb, limit_memory, memory_limit_text
from ..sql import sql_literal
from . import budget_rows, capture_merge, launch_sweep, migrations, run_cache, views
from .writer import (IngestResult, RuleResults, RunWriter, StoreError, conform, delete_rows, insert,
                     one_line_error, replace_findings, utcnow)

DEFAULT_STORE = "traceanalyzer.duckdb"
STORE_ENV = "TRACEANALYZER_STORE"
LOCK_TIMEOUT_ENV = "TRACEANALYZER_LOCK_TIMEOUT_S"
DEFAULT_LOCK_TIMEOUT_S = 30.0  # a writer's wait for another writer

# A process waiting for a locked store touches `<store>.waiting` at each try and removes it
# once it is in; a scan's writer looks for that file between two runs (a stat) and lets go of
# the store only then. Letting go after every run would cost a reopen each (~33 ms of
# connect, settings and views on a store of 200 runs, against the 0.2-0.3 s a small file
# takes a scan on 2 cores).
WAITING_SUFFIX = ".waiting"
RETRY_MAX_S = 0.2  # the longest pause between two tries to open a locked store
NOTE_AFTER_S = 1.0  # a wait this long gets a note on stderr
# An empty file, or DuckDB's headers not yet written whole, may be a store another process is
# creating right now (or copying into place): tried again until the file has stayed as it is
# for this long. Long, because a creator on a loaded machine can stall for seconds; a file
# that is plainly something else (no DuckDB magic) fails at once.
HEADER_BYTES = 3 * 4096
DUCKDB_MAGIC = (8, b"DUCK")  # where DuckDB's main header says what the file is
CREATING_WAIT_S = 10.0
HANDOVER_S = 3.0  # how long a writer that let go waits for the waiting process to get in

_T = TypeVar("_T")
# Columns that hold a point in time on the run's clock (used to compute the run's span).
def lock_timeout_from_env(default: float | None = DEFAULT_LOCK_TIMEOUT_S) -> float | None:
    """How long to wait for another process's lock: TRACEANALYZER_LOCK_TIMEOUT_S, else
    `default` (None: as long as it takes)."""
    text = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise StoreError(f"{LOCK_TIMEOUT_ENV}={text!r} is not a number of seconds") from None
    if not value >= 0:  # also NaN
        raise StoreError(f"{LOCK_TIMEOUT_ENV}={text!r} is not a number of seconds")
    return value


def default_path() -> Path:
    return Path(os.environ.get(STORE_ENV) or DEFAULT_STORE)


# The content hash (a run's identity): XXH3-128, ~4x cheaper than SHA-256 here (0.08 s
# against 0.31 s for a 400 MB file, hashed on a thread while the file is read by two
# processes on two cores, so it came straight off the ingest time). It is an identity, not
# a defence: a run id is the first 64 bits of either. A store keyed with SHA-256 keeps
# using it, so its runs are still recognized (`Store.hash_name`).
HASHES = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
DEFAULT_HASH = "xxh3_128"
_LEGACY_HASH_LENGTH = 64  # hex digits of a SHA-256 (XXH3-128 has 32)


def file_hash(path: Path, name: str = DEFAULT_HASH, chunk_bytes: int = 4 << 20) -> str:
    h = HASHES[name]()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def run_id_for(content_hash: str) -> str:
    return content_hash[:16]


class Store:
    """A DuckDB file holding any number of runs. Use as a context manager or call close()."""

    # The run's scope of the rules pass this store (or cursor) is in, set by the rules engine for
    # the run's pass: rules share results by its `memo`.
    run_cache: run_cache.RunCache | None = None

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False,
                 lock_timeout_s: float | None = None, resources: Resources | None = None):
        """`lock_timeout_s`: how long to wait for another writer's lock (default:
        TRACEANALYZER_LOCK_TIMEOUT_S, else 30 s for a writer and no limit for a reader).
        `resources`: the CPUs work on this store may use (default: all; see `use`)."""
        self.path = Path(path) if path is not None else default_path()
        if lock_timeout_s is None:
            lock_timeout_s = lock_timeout_from_env(None if read_only else DEFAULT_LOCK_TIMEOUT_S)
        self.read_only = read_only
        self.resources = resources or Resources.available()
        # SET by `set`, again at each reopen; DuckDB's threads are the resources' from the start
        self._settings: dict[str, str | int] = {"threads": self.resources.duckdb_threads}
        self._con: duckdb.DuckDBPyConnection | None = None
        if not read_only:
            self._create_whole()
        self._con = self._open(lock_timeout_s, create=not read_only)

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection; opened again here after `release`."""
        if self._con is None:
            self._con = self._open(None)
        return self._con

    @con.setter
    def con(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def _open(self, lock_timeout_s: float | None, *, create: bool = False) -> duckdb.DuckDBPyConnection:
        """Connect, and give the connection what every connection of this store has: the
        memory limit (`connect_duckdb`), the schema (`create`), the views, and what `set` set."""
        con = self._connect(lock_timeout_s)
        if self._outdated_for_reading(con):
            con.close()
            self._upgrade_for_reading(lock_timeout_s)
            con = self._connect(lock_timeout_s)
        try:
            if con.execute("SELECT lower(current_database())").fetchone()[0] == run_cache.SCOPE:
                raise StoreError(f"{self.path}: a store cannot be named {run_cache.SCOPE} (DuckDB names its catalog "
                                 "after the file, and a run's rules read their views under that name); rename it")
            if create:
                self._upgrade(con)
            _set_up(con)
            for name, value in self._settings.items():
                con.execute(f"SET {name} = {sql_literal(value)}")
        except BaseException:
            con.close()
            raise
        return con

    def _create_whole(self) -> None:
        """Make a new store whole before it appears at its path. DuckDB creates a file by
        opening it with truncation before it takes its lock, so two processes creating one
        store at once can empty the header block the first one wrote (a file no one can open
        again), and a reader can meet the file half made. The schema goes into a private file
        first, linked into place only if no other process got there before; where the folder
        cannot do that, DuckDB creates the file in place as before."""
        if str(self.path) == ":memory:" or self.path.exists():
            return
        private = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.creating")
        try:
            con = connect_duckdb(str(private))
            try:
                migrations.upgrade(con)
            finally:
                con.close()
            with contextlib.suppress(FileExistsError):
                os.link(private, self.path)
        except (OSError, duckdb.Error, MemoryLimitError):
            pass  # opening in place says what is wrong, naming the store's own path
        finally:
            for leftover in (private, private.with_name(private.name + ".wal")):
                with contextlib.suppress(OSError):
                    leftover.unlink(missing_ok=True)

    def _upgrade(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create the store's tables, or bring a store of an earlier release up to date (see
        migrations.py), saying so on stderr when it changed anything."""
        try:
            done = migrations.upgrade(con)
        except migrations.MigrationError as e:
            raise StoreError(f"{self.path}: {e}") from None
        if done and str(self.path) != ":memory:":
            print(f"note: {self.path}: store upgraded ({'; '.join(done)})", file=sys.stderr, flush=True)

    def _outdated_for_reading(self, con: duckdb.DuckDBPyConnection) -> bool:
        try:
            return self.read_only and migrations.outdated(con)
        except migrations.MigrationError as e:
            raise StoreError(f"{self.path}: {e}") from None

    def _upgrade_for_reading(self, lock_timeout_s: float | None) -> None:
        """Bring a store an earlier release made up to date before reading it (the views read
        the current schema): opened for writing once."""
        if not os.access(self.path, os.W_OK):
            raise StoreError(f"{self.path}: made by an earlier traceanalyzer, and this one cannot upgrade it "
                             "(no write access): copy it somewhere writable, or open it once with write access")
        Store(self.path, lock_timeout_s=lock_timeout_s).close()

    def _file_state(self) -> tuple[int, int, int] | None:
        """What says the file changed: (inode, size, mtime); None when there is none."""
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _being_created(self, state: tuple[int, int, int] | None, unchanged_since: float) -> bool:
        """Whether an open that found no DuckDB file may have met one another process is
        creating: the file is missing or empty, or holds DuckDB's magic with a header block
        still all zeros, or it changed since the last try (made whole, or put in place,
        meanwhile); until it has stayed as it is for CREATING_WAIT_S. A file with other
        bytes where DuckDB's magic goes is no store, at once."""
        if time.monotonic() - unchanged_since >= CREATING_WAIT_S:
            return False
        if state is None or state[1] == 0 or self._file_state() != state:
            return True
        return self._headers_unwritten()

    def _headers_unwritten(self) -> bool:
        """Whether the file's head is all zeros, or has DuckDB's magic with one of its three
        4 KB header blocks still all zeros: a creator has made the file that long and not yet
        written it (its writes can land within one tick of the file's modification time, so a
        stat may not see them)."""
        try:
            with open(self.path, "rb") as f:
                head = f.read(HEADER_BYTES)
        except OSError:
            return True
        if not head.strip(b"\0"):
            return True
        at, magic = DUCKDB_MAGIC
        return (head[at:at + len(magic)] == magic
                and any(not head[i:i + 4096].strip(b"\0") for i in range(0, HEADER_BYTES, 4096)))

    def _connect(self, lock_timeout_s: float | None) -> duckdb.DuckDBPyConnection:
        """Open the file, waiting while another process holds it: up to `lock_timeout_s` (None:
        no limit) for a writer, and with no limit when only readers hold it (DuckDB says so
        to a writer; readers hold the file for one command)."""
        if self.read_only and not self.path.exists():
            raise StoreError(f"{self.path}: no such store (run `traceanalyzer ingest` first)")
        if _is_sqlite(self.path):  # DuckDB would open it as an attached SQLite database
            raise StoreError(f"{self.path}: an SQLite file (an Nsight Systems export?), not a traceanalyzer store: "
                             "give --store a new or existing .duckdb file")
        start = time.monotonic()
        delay, asked, noted = 0.02, False, False
        seen, unchanged_since = None, start
        while True:
            before = self._file_state()
            if before != seen:
                seen, unchanged_since = before, time.monotonic()
            try:
                con = connect_duckdb(str(self.path), read_only=self.read_only)
            except MemoryLimitError as e:
                raise StoreError(str(e)) from None
            except duckdb.IOException as e:
                msg = str(e)
                if "not a valid DuckDB database" in msg and self._being_created(before, unchanged_since):
                    if not noted and time.monotonic() - start >= NOTE_AFTER_S:
                        print(f"note: {self.path}: waiting for the store (another process may be creating it)",
                              file=sys.stderr, flush=True)
                        noted = True
                    time.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
                    continue
                if "lock" not in msg.lower():
                    raise StoreError(f"{self.path}: cannot open store: {msg.splitlines()[0]}") from None
                readers = not self.read_only and "read-only mode" in msg
                waited = time.monotonic() - start
                if lock_timeout_s is not None and waited >= lock_timeout_s and not readers:
                    if asked:
                        self._withdraw()
                    raise StoreError(
                        f"{self.path}: store is locked by another traceanalyzer process; "
                        f"waited {lock_timeout_s:g} s (retry, or set {LOCK_TIMEOUT_ENV} to wait longer)") from None
                asked = self._ask_for_store() or asked
                if not noted and waited >= NOTE_AFTER_S:
                    doing = "reading" if readers else "writing"
                    print(f"note: {self.path}: waiting for the store (another process is {doing} it)",
                          file=sys.stderr, flush=True)
                    noted = True
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
            except duckdb.Error as e:
                raise StoreError(f"{self.path}: cannot open store: {str(e).splitlines()[0]}") from None
            else:
                if asked:
                    self._withdraw()
                return con

    def _waiting_file(self) -> Path:
        return self.path.with_name(self.path.name + WAITING_SUFFIX)

    def _ask_for_store(self) -> bool:
        """Say that this process waits for the store (see `WAITING_SUFFIX`); False when the
        folder cannot be written (then it waits until the holder is done)."""
        try:
            self._waiting_file().touch()
            return True
        except OSError:
            return False

    def _withdraw(self) -> None:
        with contextlib.suppress(OSError):
            self._waiting_file().unlink(missing_ok=True)

    def release(self) -> None:
        """Close the connection, so that other processes can open the file; the next use of
        the store opens it again (waiting as long as another process holds it), with the same
        settings. Only between transactions, with no cursor open (see `cursor`)."""
        if self._con is not None:
            con, self._con = self._con, None
            con.close()

    def let_in_waiting(self) -> bool:
        """If another process waits for this store, `release` it and give that process a
        moment (HANDOVER_S at most) to get in. One stat when nobody waits: a scan's writer
        calls it between two runs. True when it let go."""
        if self._con is None or str(self.path) == ":memory:":
            return False
        waiting = self._waiting_file()
        if not waiting.exists():
            return False
        self.release()
        deadline = time.monotonic() + HANDOVER_S
        while waiting.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._withdraw()  # left by a process that stopped waiting (killed) without getting in
        return True

    def use(self, resources: Resources) -> None:
        """From now on, work on this store (reading a file into it, its DuckDB queries, the
        rules engine's threads) keeps to `resources`."""
        self.resources = resources
        self.set("threads", resources.duckdb_threads)

    @contextlib.contextmanager
    def using(self, resources: Resources | None) -> Iterator[None]:
        """`use(resources)` within the block (None: unchanged), the resources before it after."""
        if resources is None:
            yield
            return
        before = self.resources
        self.use(resources)
        try:
            yield
        finally:
            self.use(before)

    def set(self, name: str, value: str | int) -> None:
        """SET a DuckDB setting (`threads`, ...) on this store's connection, now and each time
        it is opened again (see `release`)."""
        self._settings[name] = value
        self.con.execute(f"SET {name} = {sql_literal(value)}")

    @contextlib.contextmanager
    def memory_held(self, limit: str | None) -> Iterator[None]:
        """DuckDB's memory limit on this store at `limit` (DuckDB's syntax) within the block,
        where TRACEANALYZER_MEMORY_LIMIT sets none (that one holds where it does; None: no
        change). Past it, cached blocks are let go and work spills to the temp folder."""
        if limit is None or memory_limit_text():
            yield
            return
        self.set("memory_limit", limit)
        try:
            yield
        finally:
            self._settings.pop("memory_limit", None)
            self._reset_memory_limit()

    def drop_cached_blocks(self, keep: str = "256MB") -> None:
        """Let DuckDB drop the blocks of the store it keeps in memory after reading or writing
        them (its buffer pool keeps them up to its memory limit, 80% of RAM by default) down to
        `keep`: it evicts them to fit that limit for a moment, then the limit is set again. They
        are read again from the file (the OS's page cache, as a rule) when a query needs them."""
        try:
            self.con.execute(f"SET memory_limit = '{keep}'")
        except duckdb.Error:  # nothing to drop, or not now: not worth failing for
            pass
        finally:
            self._reset_memory_limit()

    def _reset_memory_limit(self) -> None:
        """The limit `memory_held` holds, else TRACEANALYZER_MEMORY_LIMIT's (or DuckDB's default)."""
        if "memory_limit" in self._settings:
            self.con.execute(f"SET memory_limit = {sql_literal(self._settings['memory_limit'])}")
        else:
            _limit_memory(self.con)

    # -- reading ---------------------------------------------------------------------
    def sql(self, query: str, params: Iterable[Any] | dict | None = None):
        """Run SQL with optional parameters; the result has .fetchall() and .df() (see also
        `df()` and `arrow()`). The on-demand views and table macros (`analyses.ON_DEMAND`) are
        there at first use."""
        run = lambda: self.con.execute(query, params) if params is not None else self.con.execute(query)  # noqa: E731
        return self._with_on_demand(run)

    def _with_on_demand(self, run: Callable[[], _T]) -> _T:
        try:
            return run()
        except duckdb.CatalogException as e:
            if not views.names_on_demand(e):
                raise
            try:  # (in a transaction the error aborted, this fails too: the error is the first one)
                views.install_on_demand(self.con)
            except duckdb.Error:
                raise e from None
            return run()

    def df(self, query: str, params=None):
        return self.sql(query, params).df()

    def arrow(self, query: str, params=None) -> pa.Table:
        self._drop_pending()

        def run() -> pa.Table:
            rel = self.con.sql(query, params=params)
            # DuckDB 2.x names it to_arrow_table; in 1.x .arrow() returns the table.
            fetch = getattr(rel, "to_arrow_table", None) or rel.arrow
            return fetch()
        return self._with_on_demand(run)

    def run_ids(self) -> list[str]:
        return [r[0] for r in self.sql("SELECT run_id FROM runs ORDER BY ingested_at, run_id").fetchall()]

    def hash_name(self) -> str:
        """The content hash this store's runs are keyed by: SHA-256 in a store that holds
        runs ingested with it, else XXH3-128 (see `HASHES`)."""
        legacy = self.sql("SELECT count(*) > 0 FROM runs WHERE length(content_hash) = ?",
                          [_LEGACY_HASH_LENGTH]).fetchone()[0]
        return "sha256" if legacy else DEFAULT_HASH

    def has_hash(self, content_hash: str) -> bool:
        return self.sql("SELECT 1 FROM runs WHERE content_hash = ?", [content_hash]).fetchone() is not None

    def resolve_run(self, ref: str) -> str:
        """A run id, a unique prefix of one (taken literally: `%` and `_` are no wildcards), or a
        source file name/path."""
        try:
            path = str(Path(ref).resolve())
        except (OSError, RuntimeError):  # a symlink loop
            path = os.path.abspath(ref)
        rows = self.sql(
            "SELECT run_id FROM runs WHERE starts_with(run_id, ?) OR source_path = ? OR file_name = ?",
            [ref, path, ref]).fetchall()
        if len(rows) == 1:
            return rows[0][0]
        raise StoreError(f"no run matches {ref!r}" if not rows else f"{ref!r} matches {len(rows)} runs")

    # -- writing ---------------------------------------------------------------------
    def write_run(self, trace: ParsedTrace, source: Path, content_hash: str,
                  file_size_bytes: int, *, findings: RuleResults | None = None) -> IngestResult:
        """Store one parsed trace in a single transaction, replacing any run with the same id;
        with `findings` (rules already evaluated on it, as by a scan's worker), those too."""
        writer = self.run_writer(lambda: run_id_for(content_hash))
        try:
            return writer.finish(trace, source, content_hash, file_size_bytes, findings=findings)
        except BaseException:
            writer.abort()
            raise

    def run_writer(self, run_id: Callable[[], str]) -> "RunWriter":
        """A TableSink that writes one run (see `RunWriter`); `run_id` is asked at the first table."""
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        return RunWriter(self.con, run_id)

    def write_findings(self, run_id: str, rule_ids: list[str], findings: pa.Table,
                       rule_runs: pa.Table) -> None:
        """Replace the findings of `rule_ids` on `run_id` in one transaction."""
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            replace_findings(con, run_id, RuleResults(rule_ids, findings, rule_runs))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def write_links(self, run_id: str, ncu_run_id: str, links: pa.Table) -> None:
        """Replace the `kernel_links` of the timeline run `run_id` with the ncu run `ncu_run_id`
        by `links` (its columns without the two run ids), in one transaction."""
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        drop = [c for c in ("run_id", "ncu_run_id") if c in links.column_names]
        links = conform("kernel_links", links.drop_columns(drop), run_id)
        links = links.append_column("ncu_run_id", pa.array([ncu_run_id] * links.num_rows, pa.string())) \
            .replace_schema_metadata(links.schema.metadata)
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("DELETE FROM kernel_links WHERE run_id = ? AND ncu_run_id = ?", [run_id, ncu_run_id])
            if links.num_rows:
                insert(con, "kernel_links", links)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def merge_capture(self, run_id: str, captures: Iterable[str | Path], *,
                      hashes: list[str] | None = None) -> "capture_merge.MergeResult":
        """Merge the capture-phase traces `captures` into the graph replays of run `run_id`
        (`capture_merge`), replacing an earlier merge, in one transaction; the run counts as
        stored anew (its rules' stored outcomes and kept caches no longer apply). Raises
        TraceError for a capture that cannot be read, CaptureMismatch (one line) when the
        captures hold none of the run's graphs: then nothing is written. `hashes` (the captures'
        content hashes) are noted with the merge (`runs.metadata.graph_capture`)."""
        from ..ingest import TraceError, one_line
        from ..ingest.kineto_capture import read_capture

        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        traces = []
        for p in map(Path, captures):
            try:
                traces.append(read_capture(p, resources=self.resources))
            except (TraceError, OSError) as e:  # said of the capture, not of the trace it is for
                why = "no such file" if isinstance(e, FileNotFoundError) else (
                    e.strerror if isinstance(e, OSError) and e.strerror else str(e))
                raise TraceError(one_line(f"capture {p.name}: {why}")) from None
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            result = capture_merge.write(con, run_id, traces,
                                         lambda name, tbl: insert(con, name, conform(name, tbl, run_id)),
                                         hashes=hashes)
            run_cache.drop_kept(con, run_id)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return result

    def read_run(self, run_id: str, tables: Iterable[str] = schema.DATA_TABLES) -> ParsedTrace:
        """Run `run_id` as a reader's ParsedTrace: `write_run` of it stores the same rows (a
        scan's worker hands a run over this way). `tables`: those that may hold rows of it
        (each costs a query). String columns come dictionary-encoded, as a reader holds them
        (kernel names repeat millions of times)."""
        rows = self.sql("SELECT format, producer, producer_version, schema_version, host, clock, rank, world_size, "
                        "warnings, metadata FROM runs WHERE run_id = $r", {"r": run_id}).fetchall()
        if not rows:
            raise StoreError(f"no run {run_id!r} in {self.path}")
        (fmt, producer, version, schema_version, host, clock, rank, world_size, warnings, metadata), = rows
        self.drop_cached_blocks()  # the rules' blocks: what is read now is another table each time
        read = {}
        for name in tables:
            # A batch at a time, its strings encoded before the next one is read: the plain
            # strings of a whole table are never held.
            reader = self.con.sql(f"SELECT * EXCLUDE (run_id) FROM {name} WHERE run_id = $r",
                                  params={"r": run_id}).to_arrow_reader(_READ_BATCH_ROWS)
            batches = [_dictionary_strings(b) for b in reader]
            if any(b.num_rows for b in batches):
                read[name] = pa.Table.from_batches(batches)
        return ParsedTrace(format=fmt, producer=producer, producer_version=version, schema_version=schema_version,
                           host=host, clock=clock, rank=rank, world_size=world_size,
                           metadata=json.loads(metadata) if metadata else {}, tables=read,
                           warnings=list(warnings or []))

    def read_findings(self, run_id: str, rule_ids: list[str]) -> RuleResults:
        """The findings and outcomes of `rule_ids` on `run_id` (without the run_id column), for
        `write_run(..., findings=)` into another store."""
        where = "WHERE run_id = $r AND list_contains($ids, rule_id)"
        params = {"r": run_id, "ids": list(rule_ids)}
        return RuleResults(list(rule_ids), self.arrow(f"SELECT * EXCLUDE (run_id) FROM findings {where}", params),
                           self.arrow(f"SELECT * EXCLUDE (run_id) FROM rule_runs {where}", params))

    def delete_run(self, run_id: str) -> None:
        self.con.execute("BEGIN TRANSACTION")
        try:
            delete_rows(self.con, run_id)
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    def ingest(self, path: str | Path, *, content_hash: str | None = None) -> IngestResult:
        """Detect, read and store one file (see `traceanalyzer.ingest.read_file`), replacing a
        run of the same content; `batch.check.check_file` decides whether a file is read at all.
        `content_hash`: the file's hash (`file_hash` with the store's `hash_name`), when the
        caller has it already."""
        from ..ingest import TraceError, read_file

        path = Path(path)
        if path.exists() and not path.is_file():  # /dev/zero would hash for ever; a pipe reads once
            raise TraceError("not a regular file (a device, pipe or folder)")
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        hash_name = self.hash_name()
        # Hashed on a worker thread while the file is parsed (hashing lets go of the GIL); a
        # reader that streams its tables waits for the hash at its first table (the run id).
        with ThreadPoolExecutor(1, thread_name_prefix="file-hash") as pool:
            hashing = pool.submit(file_hash, path, hash_name) if content_hash is None else None
            known = content_hash
            writer = self.run_writer(lambda: run_id_for(known or hashing.result()))
            try:
                trace = read_file(path, sink=writer, resources=self.resources)
                content_hash = content_hash or hashing.result()
                result = writer.finish(trace, path.resolve(), content_hash, path.stat().st_size)
            except BaseException:
                writer.abort()
                if hashing is not None:
                    hashing.result()  # a file that cannot be hashed fails as it always did
                raise
        freed = trace.nbytes + writer.nbytes
        del trace  # before the rules, which need memory of their own (see os_memory.py)
        os_memory.give_back(freed)
        return result

    @property
    def keeps_caches(self) -> bool:
        """Whether a big run's rules keep their per-run cache in this store (see
        `run_cache.scoped_to_run`): a writable store in a file."""
        return not self.read_only and str(self.path) != ":memory:"

    def kept_rows(self, run_id: str, name: str, sql: str, params: dict | None = None) -> list[dict]:
        """`sql`'s rows for one run, kept with a big run's kept cache (`run_cache.kept_rows`), and
        written there when this store keeps caches."""
        self._drop_pending()
        return run_cache.kept_rows(self.con, run_id, name, sql, params, write=self.keeps_caches)

    def kept_result(self, run_id: str, name: str, key: str, compute) -> list[dict]:
        """The rows of the relation `compute()` gives for one run, kept as `kept_rows` keeps a
        query's (`key`: the text that decides what they are)."""
        self._drop_pending()
        return run_cache.kept_result(self.con, run_id, name, key, compute, write=self.keeps_caches)

    def launch_frames(self, run_id: str, sources: tuple[str, ...], kinds: tuple[str, ...]) -> pa.Table:
        """Per GPU operation of `kinds` with a launch point, the innermost frame of each of
        `sources` open at its launch (`launch_sweep.innermost_frames`: launch_context's ids)."""
        return launch_sweep.innermost_frames(self.con, run_id, sources, kinds)

    def time_budget(self, run_ids: list[str]) -> list[dict]:
        """The time budget's rows of these runs (`budget_rows.time_budget_rows`): run_id, device_id,
        span_ns, category, cause, ns."""
        self._drop_pending()
        return budget_rows.time_budget_rows(self.con, list(run_ids), write=self.keeps_caches)

    def warmup(self, run_ids: list[str]) -> tuple[list[dict], list[dict]]:
        """The warm-up windows of these runs and the time inside them by budget part
        (`budget_rows.warmup_rows`)."""
        self._drop_pending()
        return budget_rows.warmup_rows(self.con, list(run_ids), write=self.keeps_caches)

    def _drop_pending(self) -> None:
        # DuckDB 2.x refuses new work while an execute() result is half-read (a fetchone()
        # elsewhere); abort() drops that leftover, and is a no-op when there is none.
        if hasattr(self.con, "abort"):
            self.con.abort()

    def cursor(self, *, set_up: bool = True) -> "Store":
        """This store on a new cursor of the same database, for another thread (a DuckDB
        connection is used by one thread at a time), with the views installed (unless
        `set_up` is False: then call `set_up` before using it, on any one thread). Close it
        when done; the database stays open."""
        clone = copy.copy(self)
        clone.con = interruptible(self.con.cursor())
        if set_up:
            clone.set_up()
        return clone

    def set_up(self) -> None:
        """Install the views and settings on this store's connection (see `cursor`)."""
        _set_up(self.con)

    def close(self) -> None:
        if self._con is not None:  # else released, and not opened again since
            self._con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_READ_BATCH_ROWS = 1 << 20


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\0"
    except OSError:
        return False


def _dictionary_strings(batch: pa.RecordBatch) -> pa.RecordBatch:
    """String columns dictionary-encoded. The other columns are copied too: a batch exported
    by DuckDB is freed only when none of its columns is alive, and it holds the plain strings."""
    columns = [pc.dictionary_encode(c) if pa.types.is_string(c.type) or pa.types.is_large_string(c.type)
               else pa.concat_arrays([c]) for c in batch.columns]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _limit_memory(con: duckdb.DuckDBPyConnection) -> None:
    """`resources.limit_memory` (TRACEANALYZER_MEMORY_LIMIT; past it, work spills to a temp
    folder next to the store), its error a StoreError."""
    try:
        limit_memory(con)
    except MemoryLimitError as e:
        raise StoreError(str(e)) from None


def _set_up(con: duckdb.DuckDBPyConnection) -> None:
    """What every connection (or cursor) to a store gets: the views, and no progress bar on
    the user's terminal in the middle of our own output."""
    con.execute("SET enable_progress_bar = false")
    views.install(con)


