package apicurio

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/quick"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseJavaVersions(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"17.0.15", 17, true}, {"25", 25, true}, {"21.0.2+13-LTS", 21, true}, {"1.8.0_392", 8, true},
		{"25-ea", 25, true}, {"", 0, false}, {"abc", 0, false}, {"-1", 0, false}, {"0", 0, false},
	} {
		got, ok := parseMajor(c.in)
		require.Equal(t, c.ok, ok, c.in)
		require.Equal(t, c.want, got, c.in)
	}
	major, ok := releaseMajor([]byte("IMPLEMENTOR=\"Eclipse Adoptium\"\nJAVA_VERSION=\"25.0.3\"\nOS_ARCH=\"x86_64\"\n"))
	require.True(t, ok)
	require.Equal(t, 25, major)
	_, ok = releaseMajor([]byte("IMPLEMENTOR=\"x\"\n"))
	require.False(t, ok)
	major, ok = versionMajor("openjdk version \"17.0.15\" 2025-04-15\nOpenJDK Runtime Environment\n")
	require.True(t, ok)
	require.Equal(t, 17, major)
	_, ok = versionMajor("Error: could not find libjava.so")
	require.False(t, ok)
}

// Whatever a release file or `java -version` says, reading it never panics and a version it
// accepts is a positive number.
func TestParseMajorGenerated(t *testing.T) {
	f := func(s string) bool {
		n, ok := parseMajor(s)
		_, _ = releaseMajor([]byte(s))
		_, _ = versionMajor(s)
		return ok == (n > 0)
	}
	require.NoError(t, quick.Check(f, &quick.Config{MaxCount: 2000}))
}

func TestChoose(t *testing.T) {
	j17 := Java{Path: "/jvm/17/bin/java", Major: 17}
	j25 := Java{Path: "/jvm/25/bin/java", Major: 25}
	j11 := Java{Path: "/jvm/11/bin/java", Major: 11}

	r, j, err := Choose("", []Java{j17, j25})
	require.NoError(t, err)
	require.Equal(t, Version, r.Version, "a Java 21+ runs the current release")
	require.Equal(t, j25, j)

	r, j, err = Choose("", []Java{j17})
	require.NoError(t, err)
	require.Equal(t, LegacyVersion, r.Version, "Java 17 alone runs the legacy release")
	require.Equal(t, j17, j)

	r, j, err = Choose(LegacyVersion, []Java{j25, j17})
	require.NoError(t, err)
	require.Equal(t, LegacyVersion, r.Version)
	require.Equal(t, j25, j, "the newest Java runs a release that asks for less")

	_, _, err = Choose(Version, []Java{j17})
	require.ErrorContains(t, err, "needs Java 21 or newer; the newest found is Java 17")
	require.ErrorContains(t, err, JavaEnv)

	_, _, err = Choose("", []Java{j11})
	require.ErrorContains(t, err, "needs Java 17 or newer")

	_, _, err = Choose("", nil)
	require.ErrorContains(t, err, "no Java runtime found")

	_, _, err = Choose("1.0", []Java{j25})
	require.ErrorContains(t, err, `unknown Apicurio Registry release "1.0"`)
}

func TestJavaEnvNamesAMissingRuntime(t *testing.T) {
	t.Setenv(JavaEnv, filepath.Join(t.TempDir(), "no-java"))
	_, err := Start(context.Background(), Config{})
	require.ErrorContains(t, err, JavaEnv+"=")
}

func TestJavaEnvNamesATooOldRuntime(t *testing.T) {
	javas, err := FindJavas(context.Background())
	require.NoError(t, err)
	var old string
	for _, j := range javas {
		if j.Major < 21 {
			old = j.Path
		}
	}
	if old == "" {
		t.Fatal("the machine has no Java 17: install openjdk-17-jre-headless, as .ci/run does")
	}
	t.Setenv(JavaEnv, old)
	_, err = Start(context.Background(), Config{Version: Version})
	require.ErrorContains(t, err, "needs Java 21 or newer")
}

// registryCall sends one request to the Confluent API and returns the status and the decoded
// JSON answer.
func registryCall(t *testing.T, method, url, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	client := &http.Client{}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out), "%s %s answered %s", method, url, b)
	return resp.StatusCode, out
}

// requireConfluentAPI checks the answers the project's client relies on: ids, Confluent's error
// codes for what does not exist, and 409 for a schema the subject's rule refuses.
func requireConfluentAPI(t *testing.T, base string) {
	t.Helper()
	schema := func(field, typ string) string {
		b, _ := json.Marshal(map[string]string{"schema": `{"type":"record","name":"A","fields":[{"name":"` + field + `","type":"` + typ + `"}]}`})
		return string(b)
	}
	status, out := registryCall(t, http.MethodPost, base+"/subjects/check-value/versions", schema("x", "int"))
	require.Equal(t, http.StatusOK, status, out)
	require.Contains(t, out, "id")
	id := out["id"]

	// A lookup finds the schema in another layout, as Confluent's registry does.
	spaced, _ := json.Marshal(map[string]string{"schema": "{ \"type\": \"record\",\n  \"name\": \"A\", \"fields\": [ {\"name\": \"x\", \"type\": \"int\"} ] }"})
	status, out = registryCall(t, http.MethodPost, base+"/subjects/check-value", string(spaced))
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, id, out["id"])

	status, out = registryCall(t, http.MethodGet, base+"/subjects/nope-value/versions/latest", "")
	require.Equal(t, http.StatusNotFound, status)
	require.EqualValues(t, 40401, out["error_code"], out)

	status, out = registryCall(t, http.MethodGet, base+"/subjects/check-value/versions/7", "")
	require.Equal(t, http.StatusNotFound, status)
	require.EqualValues(t, 40402, out["error_code"], out)

	status, out = registryCall(t, http.MethodGet, base+"/schemas/ids/987654", "")
	require.Equal(t, http.StatusNotFound, status)
	require.EqualValues(t, 40403, out["error_code"], out)

	status, out = registryCall(t, http.MethodPut, base+"/config/check-value", `{"compatibility":"BACKWARD"}`)
	require.Equal(t, http.StatusOK, status, out)
	status, out = registryCall(t, http.MethodPost, base+"/subjects/check-value/versions", schema("y", "string"))
	require.Equal(t, http.StatusConflict, status, out)
	require.EqualValues(t, 409, out["error_code"], out)
}

// Start runs the release the machine's newest Java runs: the current one where a Java 21+ is
// installed (this project's machines have Temurin's beside Debian's Java 17), else the legacy one.
func TestStartDefault(t *testing.T) {
	t.Parallel()
	javas, err := FindJavas(context.Background())
	require.NoError(t, err)
	want, wantJava, err := Choose("", javas)
	require.NoError(t, err)
	r, err := Start(context.Background(), Config{})
	require.NoError(t, err)
	t.Cleanup(r.Close)
	require.Equal(t, want.Version, r.Release.Version)
	require.Equal(t, wantJava, r.Java)
	if wantJava.Major < 21 {
		t.Logf("no Java 21+ under %s: started %s on Java %d", JVMDir, r.Release.Version, r.Java.Major)
	}
	require.True(t, strings.HasPrefix(r.URL, "http://127.0.0.1:"), r.URL)
	requireConfluentAPI(t, r.URL)

	// The management interface (health, metrics; the 3.x line has one) listens on loopback,
	// at the address Start chose.
	host, _, err := net.SplitHostPort(r.ManagementAddr)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", host)
	if r.Release.Version == Version {
		client := &http.Client{}
		defer client.CloseIdleConnections()
		resp, err := client.Get("http://" + r.ManagementAddr + "/health/ready")
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}

	r.Close()
	require.False(t, r.Running())
	_, err = os.Stat(r.LogPath())
	require.True(t, os.IsNotExist(err), "Close removes the run directory it made")
}

func TestStartLegacyOnJava17(t *testing.T) {
	t.Parallel()
	javas, err := FindJavas(context.Background())
	require.NoError(t, err)
	var j17 string
	for _, j := range javas {
		if j.Major == 17 {
			j17 = j.Path
		}
	}
	if j17 == "" {
		t.Fatal("the machine has no Java 17: install openjdk-17-jre-headless, as .ci/run does")
	}
	r, err := Start(context.Background(), Config{Java: j17})
	require.NoError(t, err)
	t.Cleanup(r.Close)
	require.Equal(t, LegacyVersion, r.Release.Version)
	require.Equal(t, 17, r.Java.Major)
	requireConfluentAPI(t, r.URL)
}

// A registry that dies while starting is reported with its log, not waited for.
func TestStartReportsAnEarlyExit(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "java")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\nif [ \"$1\" = -version ]; then echo 'openjdk version \"25.0.1\"' >&2; exit 0; fi\necho 'port in use' >&2\nexit 3\n"), 0o755))
	t.Setenv(JavaEnv, fake)
	_, err := Start(context.Background(), Config{})
	require.ErrorContains(t, err, "exited while starting")
	require.ErrorContains(t, err, "port in use")
}
