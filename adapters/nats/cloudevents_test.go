package nats_test

// Placeholder for the CloudEvents conformance tests: it pins their
// dependencies in go.mod.
import (
	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

var _ = []any{binding.ToEvent, jsonschema.NewCompiler, cejs.NewMessage}
