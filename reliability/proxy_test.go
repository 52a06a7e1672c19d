package reliability

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// faultProxy is a TCP proxy the test controls, placed between a relay and
// its database. It can cut every open connection, refuse new ones (accept
// and close at once, as a dead server or a firewall reset would look), and
// hold the bytes flowing in one direction, from now or from the moment the
// client sends a given message, so that a statement reaches the server but
// its answer never comes back, or never reaches the server at all.
type faultProxy struct {
	ln       net.Listener
	upstream string

	mu         sync.Mutex
	conns      map[*proxyConn]struct{}
	refusing   bool
	gates      [2]chan struct{}  // per direction; closed = open, flowing
	trigger    func([]byte) bool // armed by holdWhen: shuts gates[triggerDir]
	triggerDir int

	accepted atomic.Int64 // connections accepted in total
	refused  atomic.Int64 // connections refused while refusing
	held     atomic.Int64 // chunks that arrived while a gate was shut
	wg       sync.WaitGroup
}

// Directions for hold/release.
const (
	toServer = 0
	toClient = 1
)

type proxyConn struct {
	client, server net.Conn
	closed         chan struct{}
	once           sync.Once
	blackholed     atomic.Bool // bytes are dropped both ways; nothing is closed
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		close(c.closed)
		_ = c.client.Close()
		_ = c.server.Close()
	})
}

func newFaultProxy(t testing.TB, upstream string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &faultProxy{ln: ln, upstream: upstream, conns: map[*proxyConn]struct{}{}}
	for i := range p.gates {
		p.gates[i] = make(chan struct{})
		close(p.gates[i])
	}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		p.mu.Lock()
		refusing := p.refusing
		p.mu.Unlock()
		if refusing {
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		s, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			// The server is down: to the client this looks like a refusal.
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		pc := &proxyConn{client: c, server: s, closed: make(chan struct{})}
		p.mu.Lock()
		if p.refusing { // refused while dialling
			p.mu.Unlock()
			p.refused.Add(1)
			pc.close()
			continue
		}
		p.conns[pc] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(pc, c, s, toServer)
		go p.pipe(pc, s, c, toClient)
	}
}

func (p *faultProxy) pipe(pc *proxyConn, from, to net.Conn, dir int) {
	defer p.wg.Done()
	defer func() {
		pc.close()
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && pc.blackholed.Load() {
			continue // dropped, as by a network that silently lost the peer
		}
		if n > 0 {
			p.mu.Lock()
			if dir == toServer && p.trigger != nil && p.trigger(buf[:n]) {
				// Shut before these bytes reach the server: no part of
				// their answer can slip through.
				p.holdLocked(p.triggerDir)
				p.trigger = nil
			}
			gate := p.gates[dir]
			p.mu.Unlock()
			select {
			case <-gate:
			default:
				p.held.Add(1)
				select {
				case <-gate:
				case <-pc.closed:
					return
				}
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or a cut: either way the connection is over
			return
		}
	}
}

// cut closes every open connection, both ways.
func (p *faultProxy) cut() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// blackhole makes every open connection drop all bytes both ways without
// closing anything: to the client the server has silently gone, as after a
// network partition or a host that died without resetting its connections.
// New connections are not affected.
func (p *faultProxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.blackholed.Store(true)
	}
}

// refuse makes the proxy close new connections at once (on) or serve them
// again (off).
func (p *faultProxy) refuse(on bool) {
	p.mu.Lock()
	p.refusing = on
	p.mu.Unlock()
}

// hold stops the bytes flowing in direction dir (toServer or toClient) on
// every connection until unhold; held chunks are delivered then, unless the
// connection is cut first.
func (p *faultProxy) hold(dir int) {
	p.mu.Lock()
	p.holdLocked(dir)
	p.mu.Unlock()
}

func (p *faultProxy) holdLocked(dir int) {
	select {
	case <-p.gates[dir]:
		p.gates[dir] = make(chan struct{})
	default: // already held
	}
}

// holdWhen holds direction dir (as hold does) once a chunk a client sends
// satisfies match, before that chunk is passed on; nil match holds now. It
// fires once.
func (p *faultProxy) holdWhen(dir int, match func(chunk []byte) bool) {
	if match == nil {
		p.hold(dir)
		return
	}
	p.mu.Lock()
	p.trigger, p.triggerDir = match, dir
	p.mu.Unlock()
}

func (p *faultProxy) unhold(dir int) {
	p.mu.Lock()
	select {
	case <-p.gates[dir]:
	default:
		close(p.gates[dir])
	}
	p.mu.Unlock()
}

// outage cuts every connection and refuses new ones until the returned
// function is called.
func (p *faultProxy) outage() (resume func()) {
	p.refuse(true)
	p.cut()
	return func() { p.refuse(false) }
}

func (p *faultProxy) close() {
	_ = p.ln.Close()
	p.unhold(toServer)
	p.unhold(toClient)
	p.cut()
	p.wg.Wait()
}
