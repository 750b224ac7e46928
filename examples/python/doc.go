// Package python holds producer.py, a service written in Python (Debian's python3-psycopg2)
// that writes keiro's outbox through the SQL function <schema>.enqueue, the supported API for
// producers in other languages. Its test runs the script against a test schema and checks the
// rows it wrote; see docs/compose.md, "Producers in other languages".
package python
