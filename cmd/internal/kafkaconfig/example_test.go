package kafkaconfig_test

import (
	"fmt"

	"github.com/keiro-go/keiro/cmd/internal/kafkaconfig"
)

func ExampleConfig_ValidateFlags() {
	cfg := kafkaconfig.Config{
		Brokers: []string{"kafka-1:9092", "kafka-2"},
		SASL:    kafkaconfig.SASL{Mechanism: "SCRAM-SHA-1", Username: "relay", Password: "s3cret"},
	}
	fmt.Println(cfg.ValidateFlags())
	fmt.Printf("password: %v\n", cfg.SASL.Password)
	// Output:
	// --brokers: "kafka-2" is not host:port: the port is missing
	// --kafka-sasl-mechanism: unknown mechanism "SCRAM-SHA-1": use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM
	// password: ******
}
