package kafka_test

// Placeholder for the CloudEvents conformance tests: it pins their
// dependencies in go.mod.
import (
	cekafka "github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

var _ = []any{binding.ToEvent, jsonschema.NewCompiler, cekafka.NewMessage}
