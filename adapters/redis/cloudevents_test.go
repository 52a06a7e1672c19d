package redis_test

// Placeholder for the CloudEvents conformance tests: it pins their
// dependencies in go.mod.
import (
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

var _ = []any{binding.ToEvent, jsonschema.NewCompiler, spec.WithPrefix}
