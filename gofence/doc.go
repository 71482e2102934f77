// Package gofence is the Go side of pgfence: leases with fencing tokens that
// PostgreSQL itself enforces, over pgx v5. It applies the kit's migrations,
// hands out leases, keeps them alive, says when they are lost, waits for a
// lease without hammering the database, runs transactions under a token and
// elects leaders. It reaches the SQL functions of schema fence only through
// package sqlfuncs.
//
// # The problem
//
// A lock holder can pause (a GC pause, a stalled network), lose its lease
// without knowing, wake up and keep writing while a new holder works too.
// Lease expiry does not stop the old process. A fencing token does: every
// grant gets a strictly larger token, and the protected tables (see
// fence.protect) refuse a write whose token is older than the latest grant.
// The check runs inside the writing transaction, so no client can skip it.
//
// # Invariants
//
//   - Safety never depends on this package's timing. If a process keeps
//     writing after its lease was lost (a pause longer than any margin, a
//     clock that jumped), the database refuses its writes once a newer token
//     exists: Lease.Tx returns an error matching ErrStaleToken.
//   - No call returns, and no accessor reports, a lease as held at a local
//     time past its trust deadline: the time the acquire or the last
//     successful renewal was sent, plus the TTL, minus Config.SafetyMargin,
//     measured on the local monotonic clock. The server computes the expiry
//     from its own clock, read after the request arrived, so while the
//     clocks run at the same rate the server's expiry is later: the holder
//     is told it lost the lease before anyone else can be granted it, even
//     if the database never answers again. The margin covers the difference
//     in rate over one TTL. In particular:
//   - Acquire (waiting or not), Do and Elect compare the clock with the deadline
//     before they hand a lease over. A grant whose reply came after it (a
//     slow network, a server that answered late) is given back at once, and
//     the call returns an error matching ErrLost that says why; Do and Elect
//     do not run fn under it.
//   - Lease.Err, Lease.Done, Lease.Context and the context that Do and Elect
//     give fn look at the clock themselves each time they are asked, rather
//     than wait for the loss timer's goroutine: a process that was paused
//     past its deadline sees the loss at its first look. The timer only wakes
//     the goroutines that block on Done (and the contexts derived from
//     these). A renewal whose reply comes after the deadline does not bring
//     the lease back.
//   - A call whose context ends while its grant is on its way returns at
//     once; the grant runs to completion (bounded, 5s after the caller left)
//     and the token it brings is given back, so the next holder or candidate
//     is granted the lease without waiting for a TTL.
//   - Transient errors (broken connections, timeouts, a restarting server)
//     never end a lease on their own: renewals are retried every
//     RetryInterval until the trust deadline. A renewal that the server
//     answers with "not your lease" ends it at once, and so does a write
//     refused with FN001 (stale token) inside Tx, UseToken or Do: the
//     server has granted a newer token (loss reason "refused").
//   - Every attempt that can meet a connection gone silent (a NAT timeout,
//     a dropped route, a failover: the connection stays open and nothing
//     answers) has a bound of its own, so that the retry goes out on
//     another connection in time. A renewal's attempt gets a third of the
//     time left before the trust deadline, but at least four
//     RetryIntervals, and never more than is left; a grant, the read of the
//     holder after it, and a release get that much of the whole trust
//     window (TTL - SafetyMargin) plus 2s (the default fence.grant_wait, for
//     a grant that the server holds while a previous holder's guarded
//     transaction ends); a session lease's check gets RenewInterval/2, at
//     least 250ms. pgx closes a connection whose call its context cut off,
//     and the pool then drops it, so the next attempt takes another one. A
//     grant cut off that way may have been granted on the server: that lease
//     is nobody's and ends at its TTL.
//   - Release is idempotent and safe to retry: fence.release only ends the
//     lease that carries this lease's token, so a retry after a lost reply
//     (or a late copy of the first attempt) never ends a newer holder's
//     lease. It returns nil only when the server ended the lease or it was
//     already gone there; one that could not reach the server says so every
//     time it is called, until one does. A session lease whose session does
//     not answer is asked about over the pool: Release (and Close with
//     ReleaseOnClose) say, naming it, when the server still has it live.
//   - A session lease's session is checked every RenewInterval/2: a session
//     that the server ended is noticed within RenewInterval.
//
// # Lease states
//
//	                 Acquire
//	                  |
//	                  v
//	   +-------->  held  ---- Release ----> released (Err: ErrReleased)
//	   |           |   |
//	renewed    renew  trust deadline passed, or the server
//	   |       due     answered "not live" (expired, revoked,
//	   +-------+        superseded)
//	                     |
//	                     v
//	                   lost (Err: ErrLost; Done closed; Context cancelled)
//
// A lost lease stays lost; Release after loss returns nil (it tells the
// server once, best effort). Release is
// bounded by its context, also while another Release of the same lease is
// still trying. Client.Close waits (as long as its context allows) for the
// acquires in flight, so that none grants a lease after Close returned; a
// grant that comes back during Close is given back. With
// Config.ReleaseOnClose, Client.Close then
// releases every lease still held (they end with ErrReleased; a leader
// under Elect steps down, and Elect returns ErrClosed). Every lease Close
// does not release stops renewing and ends with ErrLost (reason
// client_closed): a TTL lease stays live on the server until its expiry
// (a token handed to another process stays valid that long), a session
// lease's session is closed. After Close returned, nothing of the Client
// runs.
//
// # What a paused process can and cannot know
//
// A process can be stopped at any instruction: a GC pause, SIGSTOP, a
// virtual machine that loses its CPU, swap. When it runs again, its first
// look at the lease (Err, Done, the Err or Done of Lease.Context or of fn's
// context) says lost if the trust deadline passed meanwhile; no look
// answers from a state that a timer has not caught up with yet. What no
// library can prevent is a pause that falls between a look and the side
// effect that the look allowed: a process that saw "held", was paused past
// its deadline, and then sends a message, writes a file, calls another
// service or makes an unfenced insert does so late, perhaps while another
// holder works. Only a write that the protected resource checks against the
// token itself (Lease.Tx, Lease.UseToken, or a service that compares tokens)
// is safe against that. For the rest, keep the window small: look right
// before each side effect, and pass fn's context (or Lease.Context) to the
// call that makes it (pgx looks at ctx.Done before it sends a query, and so
// at the clock).
//
// # Defaults and why
//
// TTL 30s: long enough that a renewal every 10s (TTL/3) survives two failed
// attempts before the deadline comes near, short enough that a crashed
// holder frees the resource within half a minute. SafetyMargin 3s (TTL/10):
// ample for clock-rate differences (parts per million) and goroutine
// scheduling. PollInterval 1s: the fallback for waiters when notifications
// are lost or a pooler (PgBouncer in transaction mode) blocks LISTEN; a
// waiter also asks again exactly when the held lease expires by the server's
// clock. Logger: none; the package stays quiet unless Config.Logger is set,
// since everything it would log also reaches the caller (Lease.Done and
// Lease.Err, returned errors).
//
// # One way to take a lease
//
// Every call that takes a lease takes the same *LeaseOptions (nil gives the
// defaults): Acquire returns the lease, Do runs a function under it and
// releases it, Elect does that in a loop for a leader. Its fields are
// independent of each other and mean the same in all three: Wait (wait for
// the lease instead of trying once), Session (a session lease instead of a
// TTL lease), Holder and TTL (instead of the Config's). So one Client, with
// one pool and one LISTEN connection, serves workers of several names, TTLs
// and kinds. A per-lease TTL brings its own renewal interval, safety margin
// and retry interval (TTL/3, TTL/10, min(1s, TTL/12)) unless the Config set
// them.
//
// Elect has no options of its own: it always waits (a campaign is a wait,
// so it ignores Wait), and after a failed campaign it pauses for the
// Client's PollInterval, the interval at which a waiter asks again anyway.
// A separate ElectOptions with a Backoff would have repeated Holder and TTL
// for one pause that nobody needed to set apart from PollInterval; one
// struct keeps every call that takes a lease spelled the same way.
//
// A call that does not get the lease says why with its error: ErrHeld (a
// *HeldError that names the live holder, its token and expiry) when another
// lease holds the resource; ErrBusy when nobody holds it but the previous
// holder's guarded transaction is still open, so that no new token can be
// granted yet (try again soon; Wait waits through both); ErrClosed after
// Close; ErrLost for a grant whose reply came after its trust deadline.
//
// # Waiting for a lease
//
// With Wait, a Client keeps one LISTEN connection on the channel
// fence_release, on which fence.release and fence.revoke announce the freed
// resource. A waiter registers before it tries, so a release between its
// try and its wait is not missed; after a reconnect of the listener every
// waiter tries again, since notifications sent meanwhile are lost. A waiter
// for a session lease waits the same way, but mostly by polling:
// fence.acquire_session has no way to ask the holder's release for a
// notification. Behind a connection pooler (the backend that answers is
// not the one announced at connect) the Client does not LISTEN at all: in
// transaction mode the channel would stay on a pooled server connection
// and its notifications reach other clients; its waiters poll every
// PollInterval (jittered), and when the held lease expires.
//
// # Fenced transactions
//
// There is one transaction helper, Tx, taking what pgx.BeginFunc takes (a
// Beginner: a pool, a connection or a pgx.Tx) with the function last, and
// its options in a *TxOptions: the leases that fence the transaction and
// pgx's transaction options. Lease.Tx is Tx under one lease. Tx begins a
// transaction and registers the tokens with fence.use_token in the same
// round trip (in a savepoint, when given a pgx.Tx), so every statement of
// the function on a protected table is fenced, whether the table carries
// its token in a column or not. Errors keep the *pgconn.PgError reachable
// with errors.As. The transaction is rolled back in a defer with a context
// that is not cancelled, so neither a cancelled caller nor a panic in the
// function leaves it open (an open guarded transaction holds the resource's
// gate, and the next grant would wait for it). Lease.UseToken and UseTokens
// do the same for a transaction the caller already has and commits itself
// (a job queue's pgx.Tx), taking the small interface DB (Exec and QueryRow)
// that pgx types and their wrappers satisfy.
//
// Several leases fence a transaction that writes rows of several resources
// (a table protected per row with Client.ProtectRows, or several protected
// tables): every token is registered in the same statement, in the order of
// the resource names, so that two transactions over the same resources take
// their gates in the same order (a grant waiting between them cannot join
// two such transactions in a lock cycle). A stale lease among them fails
// the transaction before the function runs; a row whose resource's lease
// was not passed fails its statement with ErrNoToken. A nil lease, and two
// different leases on one resource (at most one of them can be current),
// are refused before anything is sent; a lease passed twice counts once.
//
// # Leader election
//
// Elect is a waiting Acquire, then the function under the lease, then
// Release, in a loop: a leader whose lease is lost sees its context end
// (its Err and Done say so from the trust deadline on, so before another
// candidate can be elected) and campaigns again. The lease token is the term number. Cancelling
// Elect's context steps down and releases, so the next leader is elected at
// once, not after a TTL; that holds also when the context ends while a
// grant of this candidate is on its way (it is given back when it comes).
// Who leads now is Client.LeaseOf(name) with Live true: there is no
// separate call for it.
//
// # When the primary changes
//
// Give the pool every node of a highly available cluster with
// target_session_attrs=read-write (and a connect_timeout), and the Client
// follows the primary: its connections to the old one fail, and new ones
// find the new one. Nothing else is needed, and nothing hangs: across a
// failover a held lease cannot renew anywhere, so it is lost at its trust
// deadline (Done, Err matching ErrLost), before the new primary can grant
// it to anyone if the new primary received the lease's last renewal (when
// asynchronous replication lost that renewal, only if the failover took
// longer than the TTL: the database still refuses the old holder's
// writes). Its later writes fail with ErrStaleToken or ErrUnknownToken,
// and ErrLost. A waiter
// keeps asking and is granted on the new primary, with a token of a new
// epoch, once the old lease has expired there by the server's clock; Elect
// loses its term and is elected again with a larger one.
// TestPatroniGofenceAcrossFailover (the integration suite) runs it through
// Patroni; docs/ha.md has the settings and the figures.
//
// # Observing
//
// Config.Observer receives typed events (AcquireEvent, RenewEvent,
// ReleaseEvent, LossEvent, RefusalEvent, LeadershipEvent) synchronously,
// after the fact, on the goroutine that made them: an interface in this
// package, as pgx's tracers and river's hooks are, so that the library
// imports no vendor; the OpenTelemetry adapter (module otelfence) lives
// beside it. Every granted lease ends with exactly one LossEvent, whatever
// ended it (Release, Close, the loss timer, a renewal, the session's
// check), because only the goroutine whose cancel took effect reports it;
// it comes right after Done closed, never before, so that a slow or
// panicking observer (its panics are recovered and logged) can delay only
// telemetry, not the loss signal. A refused write is reported once: Tx and
// UseToken mark the error they report, and Do reports only unmarked ones.
//
// # Migrations
//
// Migrate applies the embedded migrations with golang-migrate, recording
// them in the fence_schema_migrations table, so the upstream migrate CLI and
// this package agree on the version and can be mixed. A Client checks once
// that the schema is installed at the version it needs and returns
// ErrNotInstalled otherwise.
//
// golang-migrate runs its statements without a context and keeps a
// connection when it fails to open, so the migration functions give it
// connections through a connector of their own: taken from the pool under
// the caller's context, their sockets closed when that context ends, and
// whatever golang-migrate still holds at the end closed and returned. Every
// call is bounded by its context and leaves the pool as it found it.
// MigrationVersion reads golang-migrate's record in a READ ONLY transaction
// (so reading never creates the version table) and falls back to
// fence.version() when the role cannot see the table.
package gofence
