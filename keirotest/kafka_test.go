package keirotest_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/keirotest"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// TestKafkaMethodsDocumented: Kafka is a type of this package, so go doc finds its methods
// (go doc keirotest.Kafka.FailProduces), and every method of the environment's Kafka has a
// documented counterpart here.
func TestKafkaMethodsDocumented(t *testing.T) {
	if got := reflect.TypeFor[keirotest.Kafka]().PkgPath(); got != "github.com/keiro-go/keiro/keirotest" {
		t.Fatalf("keirotest.Kafka is declared in %s; want a type of package keirotest so that go doc lists its methods", got)
	}
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/keiro-go/keiro/keirotest")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]string{}
	for _, typ := range p.Types {
		if typ.Name == "Kafka" {
			for _, m := range typ.Methods {
				documented[m.Name] = m.Doc
			}
		}
	}
	env := reflect.TypeFor[*testenv.Kafka]()
	for i := range env.NumMethod() {
		name := env.Method(i).Name
		d, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("keirotest.Kafka has no method %s of its own: go doc keirotest.Kafka.%s finds nothing", name, name)
		case !strings.HasPrefix(d, name+" "):
			t.Errorf("keirotest.Kafka.%s: want a doc comment starting with its name, got %q", name, d)
		}
	}
	if _, ok := documented["FailProduces"]; !ok {
		t.Errorf("go doc keirotest.Kafka.FailProduces finds nothing")
	}
}

// TestKafkaFields: a test's code reads the broker's fields and passes the environment's handle
// on as before.
func TestKafkaFields(t *testing.T) {
	t.Parallel()
	k := keirotest.NewKafka(t, "t1")
	if k.Cluster == nil || len(k.Seeds) == 0 || k.Client == nil || k.Kafka == nil {
		t.Fatalf("want the embedded broker's Cluster, Seeds, Client and environment handle, got %+v", k)
	}
	if k.Real() || k.Topic("t1") != "t1" || k.Group("g") != "g" {
		t.Fatalf("the embedded broker's names are the test's own: got Real %v, Topic %q, Group %q", k.Real(), k.Topic("t1"), k.Group("g"))
	}
}
