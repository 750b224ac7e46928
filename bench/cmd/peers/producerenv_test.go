package main

import (
	"strings"
	"testing"
)

// PEERS_KGO sets what it names, and refuses what it cannot read rather than measuring the
// defaults in its place.
func TestExperimentOpts(t *testing.T) {
	for _, tc := range []struct {
		spec string
		opts int    // the options it adds
		err  string // what the error names, "" for none
	}{
		{"", 0, ""},
		{"compression=lz4", 1, ""},
		{"compression=none,batchmax=1048576,linger=5ms", 3, ""},
		{"linger=0s", 1, ""},
		{"compression=brotli", 0, `compression "brotli"`},
		{"compression=", 0, `compression ""`},
		{"batchmax=lots", 0, `batchmax "lots"`},
		{"batchmax=0", 0, `batchmax "0"`},
		{"batchmax=99999999999", 0, `batchmax "99999999999"`},
		{"linger=-1ms", 0, `linger "-1ms"`},
		{"linger=soon", 0, `linger "soon"`},
		{"lingr=5ms", 0, `unknown entry "lingr=5ms"`},
		{"compression=lz4,", 0, `unknown entry ""`},
		{"compression=lz4,\x01\xff\n", 0, "unknown entry"}, // an environment variable holds no NUL
	} {
		t.Run(tc.spec, func(t *testing.T) {
			t.Setenv("PEERS_PRODUCE_STATS", "")
			t.Setenv("PEERS_KGO", tc.spec)
			opts, err := experimentOpts()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("experimentOpts() error = %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("experimentOpts(): %v", err)
			}
			if len(opts) != tc.opts {
				t.Fatalf("experimentOpts() gave %d options, want %d", len(opts), tc.opts)
			}
		})
	}
}
