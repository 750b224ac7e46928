package schema_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/schema"
)

// The tests in this file run against the real schema registry (Apicurio Registry's Confluent
// API): what a registry answers is the registry's, not a fake's idea of it.

const (
	shipV1 = `{"type":"record","name":"Shipped","namespace":"com.acme.ship","fields":[
		{"name":"id","type":"string"}]}`
	// shipV2Compatible adds a field with a default: BACKWARD-compatible with shipV1.
	shipV2Compatible = `{"type":"record","name":"Shipped","namespace":"com.acme.ship","fields":[
		{"name":"id","type":"string"},
		{"name":"carrier","type":"string","default":"none"}]}`
	// shipV2Incompatible adds a field without a default: a reader of it cannot read shipV1 data.
	shipV2Incompatible = `{"type":"record","name":"Shipped","namespace":"com.acme.ship","fields":[
		{"name":"id","type":"string"},
		{"name":"weight","type":"int"}]}`
)

// A schema the subject's compatibility rule refuses is refused with the registry's 409, as our
// permanent ErrIncompatibleSchema naming the subject, after one request; a compatible one is
// registered as the next version. CheckCompatibility gives the same verdicts beforehand.
func TestRegisterIncompatibleRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	real := newRealRegistry(t)
	subject := real.Name("ship.v1-value")
	real.SetCompatibility(t, subject, testenv.CompatibilityBackward)
	reg := newRegistry(t, real.URL())

	v1, err := reg.RegisterSchema(ctx, subject, shipV1)
	if err != nil {
		t.Fatal(err)
	}
	if v1.Version != 1 || v1.Subject != subject {
		t.Fatalf("first registration: %s version %d, want %s version 1", v1.Subject, v1.Version, subject)
	}

	verdict, err := reg.CheckCompatibility(ctx, subject, shipV2Incompatible)
	if err != nil || verdict.Compatible {
		t.Fatalf("CheckCompatibility(incompatible) = %+v, %v; want not compatible", verdict, err)
	}
	before := real.requests("POST /subjects/" + subject + "/versions")
	_, err = reg.RegisterSchema(ctx, subject, shipV2Incompatible)
	var rerr *schema.RegistryError
	if !errors.Is(err, schema.ErrIncompatibleSchema) || schema.IsRetryable(err) || !errors.As(err, &rerr) || rerr.Code != 409 {
		t.Fatalf("register an incompatible schema: err = %v, want a permanent ErrIncompatibleSchema with code 409", err)
	}
	if !strings.Contains(err.Error(), "register schema in subject "+subject) || !strings.Contains(err.Error(), "incompatible") {
		t.Fatalf("error %q does not name the subject and the refusal", err)
	}
	if n := real.requests("POST /subjects/"+subject+"/versions") - before; n != 1 {
		t.Fatalf("the refusal took %d requests; it is not retried", n)
	}
	if _, ok := real.version(t, subject, 2); ok {
		t.Fatal("the registry kept the refused schema as version 2")
	}

	verdict, err = reg.CheckCompatibility(ctx, subject, shipV2Compatible)
	if err != nil || !verdict.Compatible {
		t.Fatalf("CheckCompatibility(compatible) = %+v, %v; want compatible", verdict, err)
	}
	v2, err := reg.RegisterSchema(ctx, subject, shipV2Compatible)
	if err != nil {
		t.Fatal(err)
	}
	if v2.Version != 2 || v2.ID == v1.ID {
		t.Fatalf("compatible registration: version %d id %d; want version 2 with an id other than %d", v2.Version, v2.ID, v1.ID)
	}
	latest, err := reg.LatestSchema(ctx, subject)
	if err != nil || latest.ID != v2.ID || latest.Version != 2 {
		t.Fatalf("LatestSchema = %+v, %v; want version 2 id %d", latest, err, v2.ID)
	}
}

// A subject or version the registry does not have (40401, 40402) is ErrSubjectNotFound, and an
// id it does not have (40403) ErrUnknownSchemaID: permanent, asked once, with the registry's code.
func TestRegistryNotFoundCodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	real := newRealRegistry(t)
	known := real.Name("known-value")
	id := real.register(t, known, shipV1)
	reg := newRegistry(t, real.URL())

	missing := real.Name("missing-value")
	cases := []struct {
		name string
		call func() error
		kind error
		code int
		path string
	}{
		{"unknown subject's version", func() error { _, err := reg.SchemaByVersion(ctx, missing, 1); return err },
			schema.ErrSubjectNotFound, 40401, "GET /subjects/" + missing + "/versions/1"},
		{"unknown subject's latest", func() error { _, err := reg.LatestSchema(ctx, missing); return err },
			schema.ErrSubjectNotFound, 40401, "GET /subjects/" + missing + "/versions/latest"},
		{"unknown subject lookup", func() error { _, err := reg.LookupSchema(ctx, missing, shipV1); return err },
			schema.ErrSubjectNotFound, 40401, "POST /subjects/" + missing},
		{"known subject, unknown version", func() error { _, err := reg.SchemaByVersion(ctx, known, 9); return err },
			schema.ErrSubjectNotFound, 40402, "GET /subjects/" + known + "/versions/9"},
		{"unknown id", func() error { _, err := reg.SchemaByID(ctx, id+1_000_000); return err },
			schema.ErrUnknownSchemaID, 40403, "GET /schemas/ids/"},
	}
	for _, tc := range cases {
		before := real.requests(tc.path)
		err := tc.call()
		var rerr *schema.RegistryError
		if !errors.Is(err, tc.kind) || schema.IsRetryable(err) || !errors.As(err, &rerr) || rerr.Code != tc.code {
			t.Errorf("%s: err = %v (%#v), want permanent %v with code %d", tc.name, err, rerr, tc.kind, tc.code)
			continue
		}
		if n := real.requests(tc.path) - before; n != 1 {
			t.Errorf("%s: %d requests, a not-found answer is not retried", tc.name, n)
		}
	}

	// A subject with no version yet accepts any schema.
	verdict, err := reg.CheckCompatibility(ctx, missing, shipV2Incompatible)
	if err != nil || !verdict.Compatible {
		t.Fatalf("CheckCompatibility on a new subject = %+v, %v; want compatible", verdict, err)
	}
}

// The registry gives one schema one id, in every subject: a consumer that fetched it by id for
// one topic decodes the other topic's records from its cache. Registering the same schema again
// is a no-op that answers the same id and version.
func TestSameSchemaSameIDAcrossSubjects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	real := newRealRegistry(t)
	a, b := real.Name("a-value"), real.Name("b-value")
	reg := newRegistry(t, real.URL())
	sa, err := reg.RegisterSchema(ctx, a, shipV1)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := reg.RegisterSchema(ctx, b, shipV1)
	if err != nil {
		t.Fatal(err)
	}
	if sa.ID != sb.ID {
		t.Fatalf("one schema has ids %d (%s) and %d (%s)", sa.ID, a, sb.ID, b)
	}
	again, err := newRegistry(t, real.URL()).RegisterSchema(ctx, a, shipV1) // a fresh cache asks the registry
	if err != nil || again.ID != sa.ID || again.Version != 1 {
		t.Fatalf("registering again = %+v, %v; want id %d version 1", again, err, sa.ID)
	}
	byID, err := reg.SchemaByID(ctx, sa.ID)
	if err != nil || byID.Fingerprint != sa.Fingerprint {
		t.Fatalf("SchemaByID(%d) = %+v, %v; want the registered schema", sa.ID, byID, err)
	}
}
