package main

import (
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A command name with a space and a parenthesis: the fields are counted after the last ')'.
	line := "4242 (java (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 31 0 12345 1 1 18446744073709551615"
	if got, want := parseStatCPU([]byte(line)), 325*clockTick; got != want {
		t.Fatalf("parseStatCPU = %s, want %s", got, want)
	}
	for _, bad := range []string{"", "4242 (java", "4242 (java) S 1 2", "1 (a) S 1 1 1 0 -1 0 0 0 0 0 x 1", "1 (a) S 1 1 1 0 -1 0 0 0 0 0 -5 1"} {
		if got := parseStatCPU([]byte(bad)); got != 0 {
			t.Errorf("parseStatCPU(%q) = %s, want 0", bad, got)
		}
	}
}

func FuzzParseStatCPU(f *testing.F) {
	f.Add([]byte("1 (a b) S 1 1 1 0 -1 0 0 0 0 0 3 4 0 0"))
	f.Add([]byte("1 (a) S 1 1 1 0 -1 0 0 0 0 0 9223372036854775807 1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got := parseStatCPU(b); got < 0 {
			t.Fatalf("parseStatCPU(%q) = %s, negative", b, got)
		}
	})
}

func TestParseTCPPorts(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1538 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000   0        0 111 1 0000000000000000 20 4 30 10 -1
   1: 0100007F:D2F0 0100007F:1538 01 00000000:00000000 00:00000000 00000000   0        0 222 1 0000000000000000 20 4 30 10 -1
   2: 00000000000000000000000001000000:9C40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 333 1
   3: garbage
`
	got := parseTCPPorts(strings.NewReader(table), map[string]bool{"222": true, "333": true})
	if want := []int32{0xD2F0, 0x9C40}; !slices.Equal(got, want) {
		t.Fatalf("parseTCPPorts = %v, want %v", got, want)
	}
}

func FuzzParseTCPPorts(f *testing.F) {
	f.Add("   1: 0100007F:D2F0 0100007F:1538 01 00000000:00000000 00:00000000 00000000 0 0 222 1\n", "222")
	f.Fuzz(func(t *testing.T, table, inode string) {
		for _, p := range parseTCPPorts(strings.NewReader(table), map[string]bool{inode: true}) {
			if p < 0 || p > 65535 {
				t.Fatalf("port %d out of range", p)
			}
		}
	})
}

// TestSocketPorts finds the local port of this process's own connection, the way the
// harness finds a contender's connections to PostgreSQL.
func TestSocketPorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	port := int32(c.LocalAddr().(*net.TCPAddr).Port)
	if ports := socketPorts(os.Getpid()); !slices.Contains(ports, port) {
		t.Fatalf("socketPorts = %v, want it to hold %d", ports, port)
	}
	if ports := socketPorts(-1); ports != nil {
		t.Fatalf("socketPorts of no process = %v, want none", ports)
	}
}

// TestProcCPU reads this process's CPU time, which a busy loop raises.
func TestProcCPU(t *testing.T) {
	before := procCPU(os.Getpid())
	for procCPU(os.Getpid()) < before+2*clockTick {
		for i := 0; i < 1e6; i++ { // burn CPU until the kernel accounts two more ticks
			_ = time.Duration(i) * time.Nanosecond
		}
	}
	if procCPU(0) != 0 || procCPU(1<<30) != 0 {
		t.Fatal("procCPU of no process is not 0")
	}
}
