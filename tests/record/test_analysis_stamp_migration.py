"""Migration 0011 (``analysis_stamp``): a database stored before it gains the stamps' table and keeps its analysis
cache rows, whose watermarks are then raised in that table, not in the rows."""

from __future__ import annotations

from sqlalchemy import inspect, select

from harness.record import analysis_cache, outbox, store
from harness.record.models import AnalysisCache
from testkit.migrations import downgraded


def test_a_database_before_0011_gains_the_stamps_and_keeps_its_rows(db_url):
    handle = outbox.open_store(db_url)
    analysis_cache.write_entries(handle, "chip-a", "chip", {"all": analysis_cache.Entry("k", b"payload", 7)})
    handle.close()
    with downgraded(db_url, "0010") as engine:
        assert "analysis_stamp" not in inspect(engine).get_table_names()
    handle = store.open_database(db_url)  # migrated to the head again
    try:
        assert "analysis_stamp" in inspect(handle.engine).get_table_names()
        assert analysis_cache.read_entries(handle, "chip-a", "chip") == {
            "all": analysis_cache.Entry("k", b"payload", 7)}
        analysis_cache.stamp(handle, "chip-a", "chip", "all", "k", 9)
        assert analysis_cache.entry_keys(handle, "chip-a", "chip", ["all"]) == {"all": ("k", 9)}
        with handle.session() as session:
            assert session.scalar(select(AnalysisCache.watermark)) == 7  # the row itself: as written
    finally:
        handle.close()
