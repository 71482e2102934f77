package pgtest

import (
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy between a client and PostgreSQL that a test can
// freeze: while frozen it accepts connections and reads nothing, so bytes
// stop in both directions and nobody sees an error, as in a network partition
// or a stalled peer. Thaw lets the held bytes through; Kill closes every
// connection it carries. Delay makes one direction slow instead (every byte
// arrives late, in order, none lost), as a congested link or a peer that
// answers late does. FreezeOpen freezes only the connections open at the
// time, while new ones work: what a NAT timeout, a dropped route or a
// failover does to a pool's connections.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	frozen  bool
	conns   map[net.Conn]struct{}
	links   map[*link]struct{} // open client-server pairs, for FreezeOpen
	closed  bool
	opened  int                        // connections accepted and forwarded so far
	delay   [2]time.Duration           // per Direction
	pending [2]int                     // bytes read and not yet passed on, per Direction
	wake    map[chan struct{}]struct{} // writers waiting for a delayed chunk, woken when the delay changes
}

// Direction is one way through a Proxy.
type Direction int

const (
	// ToServer is the client's requests.
	ToServer Direction = iota
	// ToClient is the server's replies.
	ToClient
)

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
	p := &Proxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}, links: map[*link]struct{}{}, wake: map[chan struct{}]struct{}{}}
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

// link is one client connection and its server connection.
type link struct {
	frozen bool // guarded by Proxy.mu
}

// FreezeOpen stops every byte, in both directions, of the connections open
// now (they stay open, silent, and neither side sees an error), while
// connections opened later work. Thaw lets them go on.
func (p *Proxy) FreezeOpen() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.frozen = true
	}
}

// Thaw lets bytes flow again (after Freeze and FreezeOpen).
func (p *Proxy) Thaw() {
	p.mu.Lock()
	p.frozen = false
	for l := range p.links {
		l.frozen = false
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Delay holds every byte that travels in direction dir for d (measured from
// the moment the proxy read it) before passing it on, on open and new
// connections; 0 ends the delay, and bytes already held then go at once.
// Order is kept and nothing is lost.
func (p *Proxy) Delay(dir Direction, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay[dir] = d
	p.wakeWriters()
}

// wakeWriters makes every writer that waits out a delay look again.
func (p *Proxy) wakeWriters() {
	for ch := range p.wake {
		close(ch)
	}
	clear(p.wake)
}

// Pending is the number of bytes the proxy has read in direction dir and
// not yet begun to pass on because of Delay (bytes held by Freeze stay
// unread in the kernel and are not counted), so that a test can wait for a
// request or a reply to be in flight: bytes counted have not reached the
// peer.
func (p *Proxy) Pending(dir Direction) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending[dir]
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

// Close closes the proxy at once (it is closed when the test ends anyway):
// new connections are refused, open ones closed, and bytes it holds never
// arrive.
func (p *Proxy) Close() { p.close() }

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.frozen = false
	p.cond.Broadcast()
	p.wakeWriters()
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
		l := &link{}
		p.links[l] = struct{}{}
		p.opened++
		p.mu.Unlock()
		var both sync.WaitGroup
		both.Go(func() { p.pipe(client, server, ToClient, l) })
		both.Go(func() { p.pipe(server, client, ToServer, l) })
		go func() {
			both.Wait()
			p.mu.Lock()
			delete(p.links, l)
			p.mu.Unlock()
		}()
	}
}

// chunk is bytes read in one direction, with the time they were read.
type chunk struct {
	b    []byte
	read time.Time
}

// pipe copies src to dst in direction dir, waiting while the proxy is
// frozen before each read, so that frozen bytes stay in the kernel buffers.
// A writer of its own passes each chunk on once its delay has run out, so
// that a delay does not hold up the reading (and so add up).
func (p *Proxy) pipe(dst, src net.Conn, dir Direction, l *link) {
	chunks := make(chan chunk, 1024)
	written := make(chan struct{})
	go func() {
		defer close(written)
		p.write(dst, src, dir, l, chunks)
	}()
	defer func() {
		close(chunks)
		<-written
	}()
	buf := make([]byte, 32<<10)
	for {
		p.mu.Lock()
		for (p.frozen || l.frozen) && !p.closed {
			p.cond.Wait()
		}
		p.mu.Unlock()
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.pending[dir] += n
			p.mu.Unlock()
			chunks <- chunk{b: append([]byte(nil), buf[:n]...), read: time.Now()}
		}
		if err != nil { // io.EOF or a closed connection: either way, done
			return
		}
	}
}

// write passes the chunks of pipe on to dst, each once the delay of dir
// (as it is when the chunk's turn comes) has run out since it was read, and
// not while the proxy is frozen; at the end it closes both connections.
func (p *Proxy) write(dst, src net.Conn, dir Direction, l *link, chunks <-chan chunk) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	failed := false
	for c := range chunks {
		send := !failed && p.holdBack(dir, l, c.read)
		// Uncounted before the write, not after: once the peer has the
		// bytes it may answer, and a late count would still show them held.
		p.mu.Lock()
		p.pending[dir] -= len(c.b)
		p.mu.Unlock()
		if send {
			_, err := dst.Write(c.b)
			failed = err != nil
			if failed { // the reader sees the closed connection and stops
				_ = src.Close()
			}
		}
	}
}

// holdBack waits until a chunk read at read may go: its delay has run out
// and the proxy is not frozen. It returns false when the proxy was closed
// meanwhile: bytes held back then never arrive.
func (p *Proxy) holdBack(dir Direction, l *link, read time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for !p.closed {
		if p.frozen || l.frozen {
			p.cond.Wait()
			continue
		}
		wait := time.Until(read.Add(p.delay[dir]))
		if wait <= 0 {
			return true
		}
		ch := make(chan struct{})
		p.wake[ch] = struct{}{}
		p.mu.Unlock()
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ch:
		}
		timer.Stop()
		p.mu.Lock()
		delete(p.wake, ch)
	}
	return false
}
