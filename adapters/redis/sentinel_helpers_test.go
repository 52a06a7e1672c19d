package redis_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// masterName is the name the test sentinels monitor the primary under.
const masterName = "outbox"

// sentinelDownAfterEnv overrides the sentinels' down-after-milliseconds
// (see downAfterMillis).
const sentinelDownAfterEnv = "OUTBOX_REDIS_SENTINEL_DOWN_AFTER"

// downAfterMillis is the sentinels' down-after-milliseconds: 1500 unless
// OUTBOX_REDIS_SENTINEL_DOWN_AFTER says otherwise.
func downAfterMillis(t *testing.T) int {
	v := os.Getenv(sentinelDownAfterEnv)
	if v == "" {
		return 1500
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "%s", sentinelDownAfterEnv)
	require.Positive(t, n, "%s", sentinelDownAfterEnv)
	return n
}

// redisNode is one redis-server of a test-owned Sentinel set. Its port and
// directory survive a kill, so that a restart is the same server coming
// back. With a link lag, sentinels, clients and replicas reach it through
// its linkProxy, at addr; otherwise addr is its own port.
type redisNode struct {
	name string
	port int    // redis-server's own port
	addr string // host:port the others know it by (the one it announces)
	dir  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	link *linkProxy    // nil without a link lag
	rdb  *goredis.Client
}

// sentinelProc is one redis-server --sentinel of the set.
type sentinelProc struct {
	name string
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	sc   *goredis.SentinelClient
}

func (s *sentinelProc) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// sentinelSet is a primary, two replicas and three sentinels (quorum 2,
// down-after-milliseconds from downAfterMillis, failover-timeout 2000) that
// one test owns, on free loopback ports in temporary directories: it can
// SIGKILL and restart the nodes without disturbing other tests.
type sentinelSet struct {
	t         *testing.T
	bin       string
	lag       time.Duration
	nodes     []*redisNode
	sentinels []*sentinelProc

	mu       sync.Mutex
	switches []time.Time // when the first sentinel announced +switch-master
}

// newSentinelSet starts the set and waits until every sentinel knows the
// primary, both replicas (online) and the two other sentinels. lag, when
// positive, puts a linkProxy in front of every node: what a primary sends
// its replicas arrives lag later, and a kill takes the node's network down
// with it (see linkProxy).
func newSentinelSet(t *testing.T, lag time.Duration) *sentinelSet {
	t.Helper()
	s := &sentinelSet{t: t, bin: redisBinary(t), lag: lag}
	for i := range 3 {
		n := &redisNode{name: fmt.Sprintf("r%d", i+1), port: freePort(t), dir: t.TempDir()}
		n.addr = "127.0.0.1:" + strconv.Itoa(n.port)
		if lag > 0 {
			n.link = &linkProxy{addr: "127.0.0.1:" + strconv.Itoa(freePort(t)), target: n.addr, lag: lag}
			n.addr = n.link.addr
		}
		n.rdb = goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:" + strconv.Itoa(n.port), ContextTimeoutEnabled: true,
			DialTimeout: 500 * time.Millisecond, MaxRetries: -1, PoolSize: 2})
		s.nodes = append(s.nodes, n)
	}
	for i := range 3 {
		s.sentinels = append(s.sentinels, &sentinelProc{name: fmt.Sprintf("s%d", i+1), port: freePort(t), dir: t.TempDir()})
	}
	t.Cleanup(s.stopAll)
	t.Cleanup(s.dumpLogs) // runs before stopAll
	primary := s.nodes[0]
	s.start(primary, nil)
	for _, n := range s.nodes[1:] {
		s.start(n, primary)
	}
	for _, sp := range s.sentinels {
		s.startSentinel(sp, primary)
	}
	s.settle(60 * time.Second)
	s.watchSwitches()
	return s
}

// watchSwitches records every +switch-master the first sentinel announces:
// each failover it applies, whether the test caused it or not.
func (s *sentinelSet) watchSwitches() {
	ps := s.sentinels[0].sc.Subscribe(context.Background(), "+switch-master")
	s.t.Cleanup(func() { _ = ps.Close() })
	ch := ps.Channel()
	go func() {
		for range ch {
			s.mu.Lock()
			s.switches = append(s.switches, time.Now())
			s.mu.Unlock()
		}
	}()
}

// switchesSince counts the failovers announced since t.
func (s *sentinelSet) switchesSince(t time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, at := range s.switches {
		if at.After(t) {
			n++
		}
	}
	return n
}

// sentinelAddrs is the sentinels' addresses, for redis.FailoverOptions.
func (s *sentinelSet) sentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, sp := range s.sentinels {
		addrs[i] = sp.addr()
	}
	return addrs
}

// start runs n, as a replica of primary unless primary is nil, and waits
// until it answers PING (a replica answers while it syncs).
func (s *sentinelSet) start(n *redisNode, primary *redisNode) {
	s.t.Helper()
	conf := []string{
		"port " + strconv.Itoa(n.port),
		"bind 127.0.0.1",
		"dir " + n.dir,
		"logfile " + filepath.Join(n.dir, "redis.log"),
		`save ""`,
		"appendonly yes",
		"appendfsync everysec",
		// A full sync starts at once (Redis 7 waits 5 s for more replicas).
		"repl-diskless-sync yes",
		"repl-diskless-sync-delay 0",
		"replica-announce-ip 127.0.0.1",
	}
	if n.link != nil {
		_, port, _ := net.SplitHostPort(n.addr)
		conf = append(conf, "replica-announce-port "+port)
	}
	confFile := filepath.Join(n.dir, "redis.conf")
	if _, err := os.Stat(confFile); err != nil { // kept across restarts: Sentinel rewrites it
		require.NoError(s.t, os.WriteFile(confFile, []byte(strings.Join(conf, "\n")+"\n"), 0o600))
	}
	args := []string{confFile}
	if primary != nil {
		host, port, _ := net.SplitHostPort(primary.addr)
		args = append(args, "--replicaof", host, port)
	} else {
		args = append(args, "--replicaof", "no", "one")
	}
	cmd := exec.Command(s.bin, args...)
	require.NoError(s.t, cmd.Start())
	n.cmd, n.done = cmd, make(chan struct{})
	done := n.done
	go func() { _ = cmd.Wait(); close(done) }()
	poll(s.t, 15*time.Second, n.name+" to answer PING", func() (bool, string) {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(n.dir, "redis.log"))
			s.t.Fatalf("redis-server %s exited at start:\n%s", n.name, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := n.rdb.Ping(ctx).Err(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	if n.link != nil {
		require.NoError(s.t, n.link.start())
	}
}

func (s *sentinelSet) startSentinel(sp *sentinelProc, primary *redisNode) {
	s.t.Helper()
	host, port, _ := net.SplitHostPort(primary.addr)
	conf := strings.Join([]string{
		"port " + strconv.Itoa(sp.port),
		"bind 127.0.0.1",
		"dir " + sp.dir,
		"logfile " + filepath.Join(sp.dir, "sentinel.log"),
		fmt.Sprintf("sentinel monitor %s %s %s 2", masterName, host, port),
		"sentinel down-after-milliseconds " + masterName + " " + strconv.Itoa(downAfterMillis(s.t)),
		"sentinel failover-timeout " + masterName + " 2000",
		"sentinel parallel-syncs " + masterName + " 2",
	}, "\n") + "\n"
	confFile := filepath.Join(sp.dir, "sentinel.conf")
	require.NoError(s.t, os.WriteFile(confFile, []byte(conf), 0o600))
	cmd := exec.Command(s.bin, confFile, "--sentinel")
	require.NoError(s.t, cmd.Start())
	sp.cmd, sp.done = cmd, make(chan struct{})
	done := sp.done
	go func() { _ = cmd.Wait(); close(done) }()
	sp.sc = goredis.NewSentinelClient(&goredis.Options{Addr: sp.addr(), ContextTimeoutEnabled: true,
		DialTimeout: 500 * time.Millisecond, MaxRetries: -1, PoolSize: 2})
	poll(s.t, 15*time.Second, sp.name+" to answer PING", func() (bool, string) {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(sp.dir, "sentinel.log"))
			s.t.Fatalf("sentinel %s exited at start:\n%s", sp.name, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := sp.sc.Ping(ctx).Err(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// node returns the node known by addr, or nil.
func (s *sentinelSet) node(addr string) *redisNode {
	for _, n := range s.nodes {
		if n.addr == addr {
			return n
		}
	}
	return nil
}

// masterAddrs asks every sentinel for the primary's address; "" for a
// sentinel that does not answer.
func (s *sentinelSet) masterAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, sp := range s.sentinels {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		a, err := sp.sc.GetMasterAddrByName(ctx, masterName).Result()
		cancel()
		if err == nil && len(a) == 2 {
			addrs[i] = net.JoinHostPort(a[0], a[1])
		}
	}
	return addrs
}

// role returns what n's ROLE says it is: "master", "slave", or an error.
func (n *redisNode) role() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v, err := n.rdb.Do(ctx, "ROLE").Slice()
	if err != nil {
		return "error: " + err.Error()
	}
	if len(v) == 0 {
		return "empty ROLE"
	}
	r, _ := v[0].(string)
	return r
}

// replication returns n's INFO replication fields.
func (n *redisNode) replication() (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := n.rdb.Info(ctx, "replication").Result()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for line := range strings.SplitSeq(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// promoted polls until every sentinel names a primary other than victim and
// that node says it is one, and returns it. It fails the test after
// timeout.
func (s *sentinelSet) promoted(victim *redisNode, timeout time.Duration) *redisNode {
	s.t.Helper()
	var p *redisNode
	poll(s.t, timeout, "a replica to be promoted", func() (bool, string) {
		addrs := s.masterAddrs()
		for _, a := range addrs {
			if a != addrs[0] || a == victim.addr {
				return false, fmt.Sprintf("sentinels name %v (the victim is %s)", addrs, victim.addr)
			}
		}
		if p = s.node(addrs[0]); p == nil {
			return false, fmt.Sprintf("sentinels name %v, none of the nodes", addrs)
		}
		if r := p.role(); r != "master" {
			return false, fmt.Sprintf("%s is named the primary but says %s", p.name, r)
		}
		return true, ""
	})
	return p
}

// settle waits until the set is whole and every sentinel agrees on it:
// all three name the same primary and see it up, both replicas up and
// linked to it, and the two other sentinels; the primary says it is one
// with both replicas online, and the replicas say they replicate it. It
// returns that primary: usually the last one promoted, but Sentinel may
// have failed over again meanwhile.
func (s *sentinelSet) settle(timeout time.Duration) *redisNode {
	s.t.Helper()
	var primary *redisNode
	poll(s.t, timeout, "the set to be whole and steady", func() (bool, string) {
		addrs := s.masterAddrs()
		for _, a := range addrs[1:] {
			if a != addrs[0] {
				return false, fmt.Sprintf("sentinels name %v", addrs)
			}
		}
		if primary = s.node(addrs[0]); primary == nil {
			return false, fmt.Sprintf("sentinels name %v, none of the nodes", addrs)
		}
		_, port, _ := net.SplitHostPort(primary.addr)
		for _, n := range s.nodes {
			info, err := n.replication()
			if err != nil {
				return false, n.name + ": " + err.Error()
			}
			if n == primary {
				if info["role"] != "master" || info["connected_slaves"] != "2" {
					return false, fmt.Sprintf("primary %s: role %s, %s replicas", n.name, info["role"], info["connected_slaves"])
				}
				for i := range 2 {
					if r := info["slave"+strconv.Itoa(i)]; !strings.Contains(r, "state=online") {
						return false, fmt.Sprintf("primary %s: replica %s", n.name, r)
					}
				}
				continue
			}
			if info["role"] != "slave" || info["master_port"] != port || info["master_link_status"] != "up" {
				return false, fmt.Sprintf("%s: role %s of port %s, link %s (the primary is %s)", n.name, info["role"], info["master_port"], info["master_link_status"], primary.name)
			}
		}
		for _, sp := range s.sentinels {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			m, err := sp.sc.Master(ctx, masterName).Result()
			if err != nil {
				cancel()
				return false, sp.name + ": " + err.Error()
			}
			reps, err := sp.sc.Replicas(ctx, masterName).Result()
			cancel()
			if err != nil {
				return false, sp.name + ": " + err.Error()
			}
			if m["port"] != port || m["flags"] != "master" || m["num-other-sentinels"] != "2" {
				return false, fmt.Sprintf("%s: master port %s flags %s, %s other sentinels", sp.name, m["port"], m["flags"], m["num-other-sentinels"])
			}
			up := 0
			for _, r := range reps {
				if r["flags"] == "slave" && r["master-link-status"] == "ok" && r["master-port"] == port {
					up++
				}
			}
			if up != 2 {
				return false, fmt.Sprintf("%s: %d of its %d replicas up and linked to %s", sp.name, up, len(reps), primary.name)
			}
		}
		return true, ""
	})
	return primary
}

// kill takes n down as a crashed machine: its network first (with a link
// proxy, which drops what it holds), then SIGKILL. It returns once the
// process is gone, with the time n fell silent: when its proxy was closed,
// or, without one, when the process was gone.
func (s *sentinelSet) kill(n *redisNode) time.Time {
	s.t.Helper()
	require.NotNil(s.t, n.cmd, "%s is not running", n.name)
	var cut time.Time
	if n.link != nil {
		n.link.crash()
		cut = time.Now()
	}
	require.NoError(s.t, n.cmd.Process.Signal(syscall.SIGKILL))
	<-n.done
	n.cmd = nil
	if cut.IsZero() {
		cut = time.Now()
	}
	return cut
}

// stopAll shuts every process down and closes the clients (the test's
// cleanup).
func (s *sentinelSet) stopAll() {
	for _, n := range s.nodes {
		if n.link != nil {
			n.link.crash()
		}
		stopProc(n.cmd, n.done)
		n.cmd = nil
		_ = n.rdb.Close()
	}
	for _, sp := range s.sentinels {
		stopProc(sp.cmd, sp.done)
		sp.cmd = nil
		if sp.sc != nil {
			_ = sp.sc.Close()
		}
	}
}

func stopProc(cmd *exec.Cmd, done chan struct{}) {
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// dumpLogs shows the end of every log when the test failed.
func (s *sentinelSet) dumpLogs() {
	if !s.t.Failed() {
		return
	}
	show := func(name, file string) {
		b, _ := os.ReadFile(file)
		var lines []string
		for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
			if !strings.Contains(l, "configuration saved on disk") {
				lines = append(lines, l)
			}
		}
		s.t.Logf("last lines of %s's log:\n%s", name, strings.Join(lines[max(0, len(lines)-80):], "\n"))
	}
	for _, n := range s.nodes {
		show(n.name, filepath.Join(n.dir, "redis.log"))
	}
	for _, sp := range s.sentinels {
		show(sp.name, filepath.Join(sp.dir, "sentinel.log"))
	}
}

// poll calls cond every 20ms until it holds, failing the test after
// timeout with what was awaited and cond's last reason.
func poll(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (last: %s)", timeout, what, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// linkProxy stands in for a node's network: sentinels, clients and
// replicas reach the node through it (the node announces its address). It
// forwards both ways at once, except on a replication link (a connection
// whose client sent REPLCONF: a replica of this node), where what the node
// sends reaches the replica lag later, as over a slow or distant link.
// crash takes the node off the network at once: the listener and every
// connection are closed, and the bytes still on their way to a replica are
// dropped, as a machine's buffers are when it crashes (a SIGKILLed process
// alone leaves its kernel to deliver what it had written).
type linkProxy struct {
	addr, target string
	lag          time.Duration

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// start listens on addr again.
func (p *linkProxy) start() error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ln, p.conns = ln, map[net.Conn]struct{}{}
	p.mu.Unlock()
	p.wg.Add(1)
	go p.accept(ln)
	return nil
}

func (p *linkProxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.ln != ln { // crashed meanwhile
			p.mu.Unlock()
			_, _ = c.Close(), s.Close()
			return
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		var repl atomic.Bool
		go p.up(c, s, &repl)
		go p.down(s, c, &repl)
	}
}

// up forwards the client's bytes to the node, and marks the connection a
// replication link when they hold REPLCONF.
func (p *linkProxy) up(c, s net.Conn, repl *atomic.Bool) {
	defer p.wg.Done()
	defer p.closeConns(c, s)
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if !repl.Load() && bytes.Contains(bytes.ToUpper(buf[:n]), []byte("REPLCONF")) {
				repl.Store(true)
			}
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// down forwards the node's bytes to the client: at once, or, on a
// replication link, through a queue that delivers each chunk lag after it
// was read.
func (p *linkProxy) down(s, c net.Conn, repl *atomic.Bool) {
	defer p.wg.Done()
	defer p.closeConns(c, s)
	type chunk struct {
		b  []byte
		at time.Time
	}
	var queue chan chunk
	defer func() {
		if queue != nil {
			close(queue)
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			switch {
			case queue != nil:
				queue <- chunk{bytes.Clone(buf[:n]), time.Now().Add(p.lag)}
			case repl.Load() && p.lag > 0:
				queue = make(chan chunk, 1<<14)
				p.wg.Add(1)
				go func() {
					defer p.wg.Done()
					for ch := range queue {
						time.Sleep(time.Until(ch.at)) // the link's latency
						if _, err := c.Write(ch.b); err != nil {
							_ = s.Close()
							for range queue { // dropped: the link is gone
							}
							return
						}
					}
				}()
				queue <- chunk{bytes.Clone(buf[:n]), time.Now().Add(p.lag)}
			default:
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// closeConns closes both ends of a connection and forgets them.
func (p *linkProxy) closeConns(c, s net.Conn) {
	_, _ = c.Close(), s.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, s)
	p.mu.Unlock()
}

// crash closes the listener and every connection and waits for the
// forwarding goroutines to end; what they held is dropped. start brings
// the link back.
func (p *linkProxy) crash() {
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
