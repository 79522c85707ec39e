"""Test doubles shared by the test files (importable as `tests.helpers` or `helpers`)."""
