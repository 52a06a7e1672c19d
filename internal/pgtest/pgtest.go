// Package pgtest runs a PostgreSQL server owned by a test binary: its own
// data directory and loopback port, with the settings the test needs (the
// shared server cannot, for example, switch wal_level without a restart).
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// BinDirEnv names the directory holding initdb and postgres, when they are
// not in /usr/lib/postgresql/15/bin.
const BinDirEnv = "OUTBOX_TEST_PG_BINDIR"

// ErrNoBinaries is returned by Start when the server binaries are missing.
var ErrNoBinaries = errors.New("pgtest: PostgreSQL server binaries not found")

// Server is a running PostgreSQL instance.
type Server struct {
	bin, dir, data string
	port           int
	settings       []string
	cred           *syscall.Credential // run as postgres when we are root

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    bytes.Buffer
}

// Start initialises a cluster in a new temporary directory and starts it
// with settings ("name=value", passed as -c) on top of quick-test defaults.
func Start(settings ...string) (*Server, error) {
	bin := os.Getenv(BinDirEnv)
	if bin == "" {
		bin = "/usr/lib/postgresql/15/bin"
	}
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		return nil, fmt.Errorf("%w in %s (set %s)", ErrNoBinaries, bin, BinDirEnv)
	}
	dir, err := os.MkdirTemp("", "outbox-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, data: filepath.Join(dir, "data"), settings: settings}
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			s.remove()
			return nil, fmt.Errorf("pgtest: running as root and there is no postgres user to run the server as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			s.remove()
			return nil, err
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		s.remove()
		return nil, fmt.Errorf("pgtest: initdb: %w: %s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.remove()
		return nil, err
	}
	s.port = ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	if err := s.Start(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// DSN returns a URL DSN for database db on the server, as user postgres.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// Start starts the (stopped) server and waits until it accepts connections.
func (s *Server) Start() error {
	args := []string{"-D", s.data, "-p", strconv.Itoa(s.port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "shared_buffers=32MB", "-c", "max_connections=100"}
	for _, kv := range s.settings {
		args = append(args, "-c", kv)
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	cmd.Stdout, cmd.Stderr = s.writer(), s.writer()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("pgtest: postgres exited at startup:\n%s", s.Output())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgconn.Connect(ctx, s.DSN("postgres"))
		cancel()
		if err == nil {
			_ = c.Close(context.Background())
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: postgres does not accept connections: %w\n%s", err, s.Output())
		}
		time.Sleep(50 * time.Millisecond) // polling a starting server: nothing to wait on
	}
}

// Stop sends sig to the postmaster (SIGINT: fast shutdown; SIGQUIT:
// immediate, crash recovery at the next start) and waits for it to exit.
func (s *Server) Stop(sig syscall.Signal) error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-exited:
		return nil
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
		return nil
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		return fmt.Errorf("pgtest: postgres did not stop on %v:\n%s", sig, s.Output())
	}
}

// Close stops the server and removes its directory.
func (s *Server) Close() {
	_ = s.Stop(syscall.SIGINT)
	s.remove()
}

func (s *Server) remove() { _ = os.RemoveAll(s.dir) }

// Output returns what the server has logged.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

func (s *Server) writer() *lockedWriter { return &lockedWriter{s} }

type lockedWriter struct{ s *Server }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.s.out.Write(p)
}
