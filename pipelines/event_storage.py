"""Dagster's consolidated SQLite event log, with one engine per process and batched writes.

A build materialises tens of thousands of asset partitions, each one event (plus its planned
event). The stock SQLite storage builds a new SQLAlchemy engine for every connection, checks the
schema for every event, and writes each event in two transactions of its own; on a 2-core
machine that bookkeeping competed with the workers for a third of their time. This storage
keeps the same tables and the same rows, so any Dagster process reads what it wrote:

- one engine per process, with its connections kept open between writes (a closing last
  connection folds SQLite's write-ahead log back into the database, several fsyncs each time);
- a batch of asset events, which Dagster hands over when ``DAGSTER_EVENT_BATCH_SIZE`` is set
  (the events of one step's partition range; ``citycube build`` and ``make dev`` set it), is
  written in one transaction per table group instead of two per event.

Selected by ``dagster.yaml`` (``citycube dagster-home`` writes it); an instance configured with
the stock class keeps working, only slower.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as db
from dagster._core.events import ASSET_CHECK_EVENTS, ASSET_EVENTS
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log import ConsolidatedSqliteEventLogStorage
from dagster._core.storage.event_log.base import EventLogConnection, EventLogCursor, EventLogRecord
from dagster._core.storage.event_log.schema import SqlEventLogStorageTable
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._serdes import deserialize_value


class BatchedSqliteEventLogStorage(ConsolidatedSqliteEventLogStorage):
    """``ConsolidatedSqliteEventLogStorage`` with a per-process engine and batched writes."""

    def __init__(self, base_dir: str, inst_data: Any = None) -> None:
        self._engine: db.engine.Engine | None = None
        self._engine_pid = -1
        self._tables: set[str] = set()
        super().__init__(base_dir, inst_data)

    def _shared_engine(self) -> db.engine.Engine:
        """This process's engine (a forked child makes its own: connections do not cross)."""
        if self._engine is None or self._engine_pid != os.getpid():
            self._engine = db.create_engine(
                self._conn_string,
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
                pool_size=2,
                max_overflow=8,
            )
            self._engine_pid = os.getpid()
        return self._engine

    @contextmanager
    def _connect(self) -> Iterator[db.engine.Connection]:
        with self._shared_engine().connect() as conn, conn.begin():
            yield conn

    def has_table(self, table_name: str) -> bool:
        """Whether the schema has a table; once it has, it keeps it (tables are only added)."""
        if table_name in self._tables:
            return True
        with self._shared_engine().connect() as conn:
            found = bool(conn.dialect.has_table(conn, table_name))
        if found:
            self._tables.add(table_name)
        return found

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        """Store a batch of asset events: the run's rows in one transaction, their asset index
        rows in another (the stock storage commits twice per event)."""
        if not events:
            return
        event_ids: list[int] = []
        with self._connect() as conn:
            for event in events:
                result = conn.execute(self.prepare_insert_event(event))
                event_ids.append(result.inserted_primary_key[0])
        indexed = [
            (event, event_id)
            for event, event_id in zip(events, event_ids, strict=True)
            if event.is_dagster_event
            and event.dagster_event_type in ASSET_EVENTS
            and event.get_dagster_event().asset_key
        ]
        if indexed:
            with self.index_transaction() as conn:
                self._store_asset_event_tags(conn, [e for e, _ in indexed], [i for _, i in indexed])
                for event, event_id in indexed:
                    self._store_asset_event(conn, event, event_id)
        for event, event_id in zip(events, event_ids, strict=True):
            if event.is_dagster_event and event.dagster_event_type in ASSET_CHECK_EVENTS:
                self.store_asset_check_event(event, event_id)

    def get_records_for_run_except(
        self, run_id: str, cursor: str | None, skipped: Sequence[str], limit: int
    ) -> EventLogConnection:
        """A run's records after ``cursor``, leaving out the event types in ``skipped``.

        What ``get_records_for_run`` returns, minus the rows a reader does not want decoded:
        a build's progress printer reads every record of every run but has no use for the
        thousands of materialisations (``of_type`` cannot express this: it would also drop
        the log messages, which have no event type).
        """
        table = SqlEventLogStorageTable
        kind = table.c.dagster_event_type
        query = (
            db.select(table.c.id, table.c.event)
            .where(table.c.run_id == run_id)
            .where(db.or_(kind.is_(None), kind.not_in(list(skipped))))
            .order_by(table.c.id.asc())
            .limit(limit)
        )
        after = EventLogCursor.parse(cursor).storage_id() if cursor else -1  # ids are positive
        query = query.where(table.c.id > after)
        with self.run_connection(run_id) as conn:
            rows = conn.execute(query).fetchall()
        records = [
            EventLogRecord(storage_id=i, event_log_entry=deserialize_value(text, EventLogEntry))
            for i, text in rows
        ]
        last = records[-1].storage_id if records else after
        return EventLogConnection(
            records=records,
            cursor=EventLogCursor.from_storage_id(last).to_string(),
            has_more=len(rows) == limit,
        )

    def dispose(self) -> None:
        super().dispose()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
