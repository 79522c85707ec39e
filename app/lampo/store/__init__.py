"""Persistent chats: `Store` (SQLite) and its records. See sqlite_store.py for the contract."""

from lampo.store.errors import StoreError
from lampo.store.migrations import SCHEMA_VERSION, SchemaTooNew
from lampo.store.sqlite_store import ChatRecord, MessageRecord, Store

__all__ = ["ChatRecord", "MessageRecord", "SCHEMA_VERSION", "SchemaTooNew", "Store", "StoreError"]
