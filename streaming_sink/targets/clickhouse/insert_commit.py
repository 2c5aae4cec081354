"""commit_mode "insert": a staging table committed by `INSERT INTO <target> SELECT … FROM <staging>`, which
materialized views see (a partition move they never do), made repeatable by a deduplication token per
label and partition (docs/clickhouse-views.md)."""
from __future__ import annotations

from ...committable import Committable
from ..base import ConfigurationError, TargetError
from .catalog import Catalog
from .connection import Connection, literal, quote
from .engines import REPLICATED_PREFIXES
from .ledger import INSERTED, INSERTING, QUORUM, Ledger

# Fixed for every INSERT of a commit, so that a retry cuts the same rows into the same blocks (their
# deduplication ids depend on it); settings the server does not know are left out.
INSERT_SETTINGS = {
    "insert_deduplicate": "1",
    "deduplicate_insert": "'enable'",
    "deduplicate_insert_select": "'force_enable'",
    "deduplicate_blocks_in_dependent_materialized_views": "1",
    "max_threads": "1",
    "max_insert_threads": "1",
    "max_block_size": "65536",
    "max_insert_block_size": "1048576",
    "min_insert_block_size_rows": "1048576",
    "min_insert_block_size_bytes": "268435456",
    "min_insert_block_size_rows_for_materialized_views": "1048576",
    "min_insert_block_size_bytes_for_materialized_views": "268435456",
    "use_strict_insert_block_limits": "0",
}


def insert_blocks(rows: int, size: int) -> int:
    """At most how many blocks (each one id in the deduplication log) one partition's INSERT … SELECT forms: the
    INSERT squashes rows into a block until it reaches the fixed row or byte minimum of INSERT_SETTINGS."""
    if rows <= 0:
        return 0
    return 1 + rows // int(INSERT_SETTINGS["min_insert_block_size_rows"]) + size // int(INSERT_SETTINGS["min_insert_block_size_bytes"])


class InsertCommit:
    """Copies a staging table into its target with INSERTs the views see; a repeat inserts nothing twice.

    ClickHouse facts this relies on (in our words; sources below, behaviour checked on chdb 4.4 = ClickHouse 26.9):

    * A materialized view is a trigger on INSERT into its source table; a partition move is not an
      INSERT, so views miss moved rows (review R8; the INSERT SELECT here fires them).
    * An INSERT is not atomic across a table and its views: an interrupted one may have written the
      table and some views; retrying it with deduplication on is the documented way to complete it
      exactly once (docs: guides/developer/deduplicating-inserts-on-retries, "Uncertain insert
      status"; reference/settings/session-settings/materialized-views, materialized_views_ignore_errors).
    * Deduplication needs the table to keep a log of inserted blocks: `non_replicated_deduplication_window`
      > 0 on a plain *MergeTree (its default is 0: no deduplication), `replicated_deduplication_window`
      (and `_seconds`) on Replicated/Shared ones (same guide, "Insert deduplication for tables"; merge-tree
      settings reference). A block older than the window is forgotten, and inserted again.
    * `insert_deduplication_token` replaces the content hash; it is kept per partition, and each block of a
      multi-block insert gets its own id from the token and the block's number, so a retry must cut the rows
      into the same blocks (settings reference, insert_deduplication_token; we saw a retry with another
      block size skip rows it had never inserted). Hence one INSERT per staging partition (rows of one target
      partition), rows in a total order (ORDER BY every column), one thread, and fixed block sizes.
    * INSERT … SELECT deduplicates only when its SELECT is stable or a token is given
      (`deduplicate_insert_select`, newer releases; `insert_select_deduplicate` before): we give a token and
      ask for `force_enable` where the server knows the setting, so it fails rather than silently not dedupe.
    * Views: a block deduplicated in the table still flows into its views on current releases, and each
      view's table drops it only with `deduplicate_blocks_in_dependent_materialized_views` = 1 and its own
      deduplication window (guide, "Insert deduplication with materialized views"; measured: a view whose
      table has no window counted the repeat twice). Older releases skipped the views of a deduplicated block
      (ClickHouse/ClickHouse PR #54184 changed parts of it). Requiring a window on every view's table is
      right under both, so `check_loadable` refuses a view whose table cannot deduplicate.
    * The log is a count: each new block adds its id and the oldest beyond the window is forgotten; a block
      found in the log adds nothing (MergeTreeDeduplicationLog in ClickHouse's source; merge-tree settings
      reference, replicated_deduplication_window). So a repeat is a no-op only while fewer than `window`
      newer blocks reached the table, from this label or any other.

    Hence the ledger gets an `inserted` row after each partition's INSERT, and a resumed commit skips the
    partitions it names: only the INSERT in flight at a crash is repeated and relies on the log. The first
    step still refuses a table (or view's table) whose window is below the label's blocks times
    `commit_parallelism`, the most that can reach it between that INSERT and its repeat
    (`_refuse_a_window_below_the_label`; reliability review 2026-11-24, F1).
    """

    def __init__(self, connection: Connection, ledger: Ledger, catalog: Catalog) -> None:
        self._connection, self._ledger, self._catalog = connection, ledger, catalog
        self._settings: dict[str, str] | None = None  # the deduplication settings this server knows

    def insert(self, c: Committable, states: set[str], staging_engine: str) -> None:
        """Every staging partition the ledger does not name inserted, each journaled after its INSERT. A replicated
        staging table is synced first, so the listing and count below hold every part written."""
        connection, staging = self._connection, c.label
        if staging_engine.startswith(REPLICATED_PREFIXES):
            connection.sync_replica(staging)
        sizes = connection.partition_sizes(staging)
        held = connection.count_rows(staging)
        if held != c.rows:
            raise TargetError(
                f"staging table {staging} holds {held} rows but {c.rows} were prepared: something changed it after prepare"
            )
        if not states:
            self._catalog.refuse(c.table)
            self._refuse_a_window_below_the_label(c, sizes)
            self._ledger.write(c, INSERTING)  # journaled before the first INSERT: from here it is never aborted
            done: set[str] = set()
        else:
            done = set(self._ledger.partitions(c.label, INSERTED))  # empty for a label an older version began: all repeated
        columns = ", ".join(quote(name) for name in self._catalog.columns(staging))
        quorum = self._catalog.engine_of(c.table).startswith("Replicated")  # Shared*: every insert is a quorum insert already
        for partition_id in sorted(set(sizes) - done):
            settings = self._settings_sql(f"{staging}:{partition_id}", quorum)
            connection.client().command(
                f"INSERT INTO {connection.table(c.table)} ({columns}) SETTINGS {settings} "
                f"SELECT {columns} FROM {connection.table(staging)} WHERE _partition_id = {literal(partition_id)} ORDER BY {columns}"
            )
            self._ledger.write_partition(c, INSERTED, partition_id, sizes[partition_id][0])

    def _refuse_a_window_below_the_label(self, c: Committable, sizes: dict[str, tuple[int, int]]) -> None:
        """Refuse, before the `inserting` row, a label a crash could leave for a repeat its tables' logs no longer match.

        Between an INSERT cut by a crash and its repeat, each of the `commit_parallelism` commits running at
        once may add about as many blocks as this label to the same table and views; a window below that
        could forget the cut INSERT's blocks and insert them twice.
        """
        catalog = self._catalog
        entry = catalog.entry(self._connection.database, c.table)
        if entry is None:
            return  # gone: the INSERT fails and says so
        blocks = sum(insert_blocks(rows, size) for rows, size in sizes.values())
        least = blocks * catalog.commit_parallelism
        why = (f"the label inserts {len(sizes)} partition(s) in about {blocks} block(s) and up to "
               f"{catalog.commit_parallelism} commit(s) run at once (commit_parallelism)")
        tables, _ = catalog.deduplicating_tables(entry)
        short = [problem for table in tables if (problem := catalog.window_shortfall(table, least, why))]
        if short:
            raise ConfigurationError(
                f"ClickHouse commit of {c.label} into {entry.qualified} refused before anything was inserted (the batch "
                f"stays PREPARED and is committed at the next start once the window is raised): " + "; ".join(short)
                + ". See docs/clickhouse-views.md"
            )

    def _settings_sql(self, token: str, quorum: bool = False) -> str:
        if self._settings is None:
            known = {
                r[0]
                for r in self._connection.client().query(
                    "SELECT name FROM system.settings WHERE has({names:Array(String)}, name)",
                    parameters={"names": list(INSERT_SETTINGS)},
                ).result_rows
            }
            self._settings = {name: value for name, value in INSERT_SETTINGS.items() if name in known}
        settings = {**self._settings, "insert_deduplication_token": literal(token)}
        if quorum:
            settings.update({name: literal(value) for name, value in QUORUM.items()})
        return ", ".join(f"{name} = {value}" for name, value in settings.items())
