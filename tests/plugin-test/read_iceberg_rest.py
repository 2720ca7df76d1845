#!/usr/bin/env python3
"""Reader for the Iceberg sink on a REST catalog (`iceberg-rest.yaml`): the
table's live rows, found by name in the catalog WEIR_TEST_ICEBERG_REST
names and scanned by pyiceberg's `RestCatalog` (which applies the sink's
position and equality deletes). A table the catalog does not have, or
without a snapshot yet, is empty. Needs the repository's .venv.
"""

from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

import weir_rows


def main():
    catalog = load_catalog("rest", type="rest", uri=weir_rows.env("WEIR_TEST_ICEBERG_REST"))
    try:
        table = catalog.load_table(weir_rows.table())
    except (NoSuchTableError, NoSuchNamespaceError):
        return
    if table.current_snapshot() is None:
        return
    for row in table.scan().to_arrow().to_pylist():
        weir_rows.print_row(row)


if __name__ == "__main__":
    main()
