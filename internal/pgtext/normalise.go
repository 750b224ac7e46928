package pgtext

// normalisedErrorSQL is the normalisation of an error text column ({{column}}), which groups
// failures by error: UUIDs become <id>, runs of 16 or more hex digits <hex>, and whole or
// decimal numbers <n> (an id, an offset, an amount), so that "order 41 …" and "order 42 …"
// fall in one group; the result is cut to 500 characters.
const normalisedErrorSQL = `left(regexp_replace(regexp_replace(regexp_replace(coalesce({{column}}, ''),
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<id>', 'g'),
    '\m[0-9a-fA-F]{16,}\M', '<hex>', 'g'),
    '\m[0-9]+(\.[0-9]+)?\M', '<n>', 'g'), 500)`

// NormalisedErrorSQL is the SQL expression of column's error text normalised for grouping:
// UUIDs, long hex runs and numbers replaced by <id>, <hex> and <n>, cut to 500 characters. The
// outbox's and the inbox's failure groups use it, so both group alike.
func NormalisedErrorSQL(column string) string {
	return Expand(normalisedErrorSQL, "column", column)
}
