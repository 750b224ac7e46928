package pgtext

import "fmt"

// PrefixNone, as a prefix length, reads none of a column (PrefixSQL).
const PrefixNone = -1

// PrefixSQL is the SQL expression that reads at most $param bytes of the bytea column: all of
// it when the parameter is 0, none when it is negative (PrefixNone). A value stored out of
// line is read only as far as the prefix goes; octet_length(column) reads its whole size from
// the row without reading the value. Listings use it so that a page of rows with payloads of
// megabytes reads only what it shows.
func PrefixSQL(column string, param int) string {
	return fmt.Sprintf(`CASE WHEN $%[2]d::int > 0 THEN substring(%[1]s FROM 1 FOR $%[2]d)
    WHEN $%[2]d::int < 0 THEN ''::bytea ELSE %[1]s END`, column, param)
}
