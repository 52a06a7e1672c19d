package webhook_test

// Placeholder for the CloudEvents conformance tests: it pins their
// dependencies in go.mod.
import (
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/santhosh-tekuri/jsonschema/v6"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

var _ = []any{binding.ToEvent, jsonschema.NewCompiler, cehttp.NewMessageFromHttpRequest, standardwebhooks.NewWebhook}
