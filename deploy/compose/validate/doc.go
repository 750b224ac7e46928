// Package validate checks the repository's docker-compose.yml and Dockerfile without a
// Docker engine, so CI catches a broken demo stack: the compose file must load with compose-go
// (the Compose specification's reference parser); every depends_on target must exist, with a
// healthcheck when the condition is service_healthy; build contexts, Dockerfiles, build
// targets and bind-mounted host paths must exist; published host ports must not collide; and
// the KEIRO_* variables given to the relay and consumer must be ones their binaries read
// ([AllowedEnv]). The Dockerfile must be parse-sane: every FROM stage a COPY --from or FROM
// names is defined earlier, every COPY source exists in the build context and is not excluded
// by .dockerignore, and every ./cmd package it builds exists.
//
// The package's tests also run the stack's configuration: the relay and consumer built from
// the repository, started with the environment, command and healthcheck the compose file gives
// them ([ServiceEnv], [ServiceCommand]), with the compose network's addresses mapped onto the
// machine ([Network]) and the topics [TopicInitService] creates ([InitTopics]), on a real
// Kafka and PostgreSQL (docs/compose.md).
//
// It is a module of its own (go.mod here, replacing github.com/keiro-go/keiro with the
// repository), so that compose-go and BuildKit stay out of the main module. Run it with
// `cd deploy/compose/validate && go test ./...` (the Makefile's compose-check target; make test
// runs it).
package validate
