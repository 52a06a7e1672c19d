package webhook_test

// Placeholder for the CloudEvents conformance tests: it pins their
// dependencies in go.mod.
import (
	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/santhosh-tekuri/jsonschema/v6"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

var _ = []any{binding.ToEvent, jsonschema.NewCompiler, cehttp.NewMessageFromHttpRequest, standardwebhooks.NewWebhook}
