package main

import (
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

const consumerMain = `package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/adapters/nats"
	"github.com/gorm-outbox/outbox/adapters/rabbitmq"
	"github.com/gorm-outbox/outbox/adapters/redis"
	"github.com/gorm-outbox/outbox/adapters/webhook"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Every adapter is linked in; the webhook one delivers for real.
var _ = []any{kafka.New, nats.New, rabbitmq.New, redis.New}

func main() {
	db, err := gorm.Open(postgres.Open(os.Getenv("OUTBOX_TEST_POSTGRES_DSN")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	table := "installcheck_" + hex.EncodeToString(b)
	defer db.Exec("DROP TABLE IF EXISTS " + table)
	ob := outbox.Plugin(outbox.Config{Table: table})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	secret := []byte("installcheck")
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(secret, r.Header, body, time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		got <- string(body)
	}))
	defer srv.Close()
	sender, err := webhook.New(srv.URL, secret, webhook.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ob.Handle("installed", sender.Handler())
	if err := db.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{ID: "e1", Type: "installed", Payload: map[string]string{"hello": "world"}})
	}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatalf("relay: %v", err)
	}
	n, err := relay.ProcessOnce(context.Background())
	if err != nil || n != 1 {
		log.Fatalf("relay: %d events, %v", n, err)
	}
	select {
	case body := <-got:
		fmt.Println("delivered:", body)
	case <-time.After(10 * time.Second):
		log.Fatal("nothing delivered")
	}
}
`

// consumer installs the modules into an empty module, builds a program on
// them and runs it.
func consumer(env []string, tmp string, mods []published, version string) error {
	if os.Getenv("OUTBOX_TEST_POSTGRES_DSN") == "" {
		return errors.New("OUTBOX_TEST_POSTGRES_DSN is not set: the installed program needs PostgreSQL")
	}
	dir := filepath.Join(tmp, "consumer")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	goVersion := strings.TrimPrefix(strings.TrimSpace(output(exec.Command("go", "env", "GOVERSION"))), "go")
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/consumer\n\ngo "+goVersion+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(consumerMain), 0o644); err != nil {
		return err
	}
	get := []string{"get"}
	for _, m := range mods {
		get = append(get, m.path+"@"+version)
	}
	get = append(get, "gorm.io/driver/postgres@v1.6.3")
	for _, args := range [][]string{get, {"mod", "tidy"}, {"build", "-o", "consumer", "."}} {
		if err := gocmd(env, dir, args...); err != nil {
			return err
		}
	}
	log.Printf("installed %d modules at %s with go get", len(mods), version)
	cmd := exec.Command(filepath.Join(dir, "consumer"))
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("the installed program failed: %w\n%s", err, out)
	}
	log.Printf("the installed program ran: %s", strings.TrimSpace(string(out)))
	return installCommand(env, tmp, dir, mods, version)
}

// installCommand installs the outbox command as its README says, go
// install .../cmd/outbox@version, and runs its version subcommand, which
// must report the version installed.
func installCommand(env []string, tmp, dir string, mods []published, version string) error {
	const cmdPath = corePath + "/cmd/outbox"
	if !slices.ContainsFunc(mods, func(m published) bool { return m.path == cmdPath }) {
		return nil
	}
	bin := filepath.Join(tmp, "bin")
	if err := gocmd(append(env, "GOBIN="+bin), dir, "install", cmdPath+"@"+version); err != nil {
		return err
	}
	out, err := exec.Command(filepath.Join(bin, "outbox"), "version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("the installed outbox command failed: %w\n%s", err, out)
	}
	if want := "outbox " + version + " (core " + version + ","; !strings.HasPrefix(string(out), want) {
		return fmt.Errorf("outbox version printed %q, want it to start with %q", out, want)
	}
	log.Printf("go install %s@%s: %s", cmdPath, version, strings.TrimSpace(string(out)))
	return nil
}
