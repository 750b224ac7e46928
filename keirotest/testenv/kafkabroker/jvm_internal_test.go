package kafkabroker

import (
	"os/exec"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestJVMOptions checks that a node's JVM gets the test suite's serial collector unless
// Config.JVMOptions replaces it, that -Xmx (HeapMB) follows the options, and that the JVM
// accepts each set (a JVM given two collectors refuses to start).
func TestJVMOptions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      []string
		want, not string
	}{
		{"default", DefaultJVMOptions, "-XX:+UseSerialGC", "-XX:+UseG1GC"},
		{"kafka", KafkaJVMOptions, "-XX:+UseG1GC", "-XX:+UseSerialGC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &Node{jvmOpts: tc.opts, heapMB: 1024}
			// -version where the main class goes: java reads it as an option, prints its
			// version and exits, after checking every option before it.
			args := n.jvmArgs("-version")
			require.Contains(t, args, tc.want)
			require.NotContains(t, args, tc.not)
			xmx := slices.Index(args, "-Xmx1024m")
			require.Greater(t, xmx, slices.Index(args, tc.opts[len(tc.opts)-1]), "-Xmx follows the options: %q", args)
			if _, err := exec.LookPath("java"); err != nil {
				t.Fatalf("java: %v (the broker's tests need Java 17)", err)
			}
			out, err := exec.Command("java", args...).CombinedOutput()
			require.NoError(t, err, "java %q: %s", args, out)
		})
	}
	t.Run("start applies the default", func(t *testing.T) {
		cfg := Config{}
		cfg.applyJVMDefaults()
		require.Equal(t, DefaultJVMOptions, cfg.JVMOptions)
		cfg = Config{JVMOptions: KafkaJVMOptions}
		cfg.applyJVMDefaults()
		require.Equal(t, KafkaJVMOptions, cfg.JVMOptions)
	})
}
