"""Every Parquet table and column is documented (collectors/schema_docs.py), so the run-folder
reference page generated from it never misses one or lists one that is gone."""

from __future__ import annotations

import pyarrow as pa

from collectors import schema_docs, schemas


def test_every_table_of_schemas_is_documented() -> None:
    tables = {value for name, value in vars(schemas).items() if name.endswith("_TABLE")}
    documented = set(schema_docs.TABLES)
    assert documented == tables
    schema_objects = [v for n, v in vars(schemas).items()
                      if n.endswith("_SCHEMA") and isinstance(v, pa.Schema)]
    assert len(schema_objects) == len(tables)
    assert {id(s) for s, _, _ in schema_docs.TABLES.values()} == {id(s) for s in schema_objects}


def test_every_column_has_a_line_and_no_line_names_a_missing_column() -> None:
    for name, (schema, about, columns) in schema_docs.TABLES.items():
        assert about.strip(), name
        assert set(columns) == set(schema.names), (
            f"{name}: give each new column its line in collectors/schema_docs.py (and drop the "
            f"lines of removed ones): {sorted(set(columns) ^ set(schema.names))}")
        assert all(text.strip() for text in columns.values()), name


def test_every_outcome_class_is_documented() -> None:
    assert set(schema_docs.OUTCOME_DOCS) == set(schemas.OUTCOMES), (
        "give each outcome class its line in collectors/schema_docs.py: OUTCOME_DOCS")
