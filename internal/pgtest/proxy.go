package pgtest

import (
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy is a TCP proxy between a client and PostgreSQL that a test can
// freeze: while frozen it accepts connections and reads nothing, so bytes
// stop in both directions and nobody sees an error, as in a network partition
// or a stalled peer. Thaw lets the held bytes through; Kill closes every
// connection it carries.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
	conns  map[net.Conn]struct{}
	closed bool
	opened int // connections accepted and forwarded so far
}

// NewProxy listens on a free loopback port and forwards to the host and port
// of targetURL. It is closed when the test ends.
func NewProxy(t testing.TB, targetURL string) *Proxy {
	t.Helper()
	u, err := url.Parse(targetURL)
	if err != nil {
		t.Fatalf("pgtest: proxy target %q: %v", targetURL, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is targetURL with its host and port replaced by the proxy's.
func (p *Proxy) URL(targetURL string) string {
	u, _ := url.Parse(targetURL)
	u.Host = p.ln.Addr().String()
	return u.String()
}

// Freeze stops every byte in both directions, on open and new connections.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// Thaw lets bytes flow again.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	p.frozen = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Opened is the number of connections the proxy has accepted and forwarded
// so far (also while frozen: a client's new connection is accepted, and then
// hangs), so that a test can wait for a client to have reconnected.
func (p *Proxy) Opened() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.opened
}

// Kill closes every connection the proxy carries (both sides see a reset).
func (p *Proxy) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.frozen = false
	p.cond.Broadcast()
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Kill()
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.opened++
		p.mu.Unlock()
		go p.pipe(client, server)
		go p.pipe(server, client)
	}
}

// pipe copies src to dst, waiting while the proxy is frozen before each
// read, so that frozen bytes stay in the kernel buffers.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		p.mu.Lock()
		for p.frozen && !p.closed {
			p.cond.Wait()
		}
		p.mu.Unlock()
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.frozen && !p.closed { // froze while we were reading: hold these bytes
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF or a closed connection: either way, done
			return
		}
	}
}
