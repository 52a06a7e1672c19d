package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Port returns the server's loopback port.
func (s *Server) Port() int { return s.port }

// Standby makes a streaming standby of s, which must be running with
// wal_level=replica (or logical) and free WAL senders: pg_basebackup -R
// copies s into a new temporary directory, and the copy starts on port
// (0: a free one) as a hot standby streaming from s under application
// name name (what synchronous_standby_names on s refers to), with
// settings on top of the quick-test defaults. The standby's own settings
// are those it needs once promoted as well. Close removes it.
func (s *Server) Standby(name string, port int, settings ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "outbox-pg-standby-")
	if err != nil {
		return nil, err
	}
	st := &Server{bin: s.bin, dir: dir, data: filepath.Join(dir, "data"), cred: s.cred}
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			st.remove()
			return nil, err
		}
	}
	if port == 0 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			st.remove()
			return nil, err
		}
		port = ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
	}
	st.port = port
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", s.port, name)
	backup := exec.Command(filepath.Join(s.bin, "pg_basebackup"), "-D", st.data, "-d", conninfo,
		"-R", "-X", "stream", "-c", "fast", "--no-sync")
	backup.Dir = dir
	backup.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := backup.CombinedOutput(); err != nil {
		st.remove()
		return nil, fmt.Errorf("pgtest: pg_basebackup: %w: %s", err, out)
	}
	// -R wrote standby.signal and a primary_conninfo; the command line
	// names the one to use, with the application name.
	st.settings = append([]string{"primary_conninfo=" + conninfo, "hot_standby=on"}, settings...)
	if err := st.Start(); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// Promote promotes the standby (pg_ctl promote) and waits until it accepts
// writes.
func (s *Server) Promote() error {
	cmd := exec.Command(filepath.Join(s.bin, "pg_ctl"), "promote", "-D", s.data, "-w", "-t", "60")
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: pg_ctl promote: %w: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		c, err := pgconn.Connect(ctx, s.DSN("postgres")+"&target_session_attrs=read-write")
		if err == nil {
			_ = c.Close(context.Background())
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("pgtest: the promoted server does not accept writes: %w\n%s", err, s.Output())
		}
		time.Sleep(20 * time.Millisecond) // polling a server leaving recovery: nothing to wait on
	}
}
