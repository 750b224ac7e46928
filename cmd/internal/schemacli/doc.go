// Package schemacli implements `relay schema register|check`: registering an Avro schema file
// under a Schema Registry subject, and asking the registry whether a schema file is
// compatible with the subject's latest version before deploying a producer that writes it.
//
// Exit codes: 0 success (registered, or compatible), 1 incompatible (the registry's reasons
// are printed), 2 usage, configuration or registry errors. The registry password is a secret:
// it is never printed, in help, errors or otherwise.
package schemacli
