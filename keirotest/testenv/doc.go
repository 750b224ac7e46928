// Package testenv is the environment of keiro-go's tests: a migrated PostgreSQL schema per test
// (NewDB, NewSchema) and an embedded Kafka broker with failure injection (NewKafka,
// Kafka.FailProduces). It depends on no keiro component but the migrations, so that the
// components' own tests can use it too.
//
// Services use it through package keirotest, which re-exports all of it next to the
// assertions on outbox rows, topics and inbox deliveries.
package testenv
