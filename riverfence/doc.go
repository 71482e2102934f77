// Package riverfence fences the job attempts of River
// (github.com/riverqueue/river), the PostgreSQL job queue for Go on pgx v5,
// with pgfence's tokens: every attempt of a job runs under a lease of its
// own, so that an attempt that River rescued while it was still running can
// no longer write the job's results or complete the job.
//
// # The problem
//
// River's rescuer hands a job that has run longer than its timeout and than
// RescueStuckJobsAfter to a new attempt, whether or not the old attempt's
// goroutine still runs: a worker that ignores its context, a GC pause, a
// stalled connection or a slow dependency leave it running ("A worker that
// ignores cancellation may continue running even after the client has timed
// out the job or the job rescuer has moved it out of running", River's
// Worker docs). Both attempts then write the job's results, and the old one
// can complete the job row over the new attempt's work: River completes a
// row by its id while it is running, whichever attempt runs it. This is the
// zombie worker that fencing tokens exist for.
//
// # What the middleware does
//
// Middleware (for river.Config.Middleware) takes, before each attempt's
// Work, a TTL lease on the job's resource, Config.ResourcePrefix followed by
// the job id ("river_job:42"), through a gofence.Client. Each grant has a
// larger token than the one before, so each attempt of a job has a larger
// token than every earlier attempt. Inside Work, Lease(ctx) is that lease;
// Tx runs a transaction under its token (gofence.Lease.Tx), and CompleteTx
// writes the results and completes the job (river.JobCompleteTx) in one
// such transaction. Once a newer attempt has its token, both fail with
// gofence.ErrStaleToken (FN001) and commit nothing; and a transaction that
// is under way when the newer attempt asks for its lease holds the grant
// back until it ends (pgfence's guarantee 3), so no write of the old attempt
// commits after the new attempt's token exists.
//
// # The lease's lifetime
//
// River computes an attempt's deadline as the worker's Timeout, else the
// client's JobTimeout, but does not tell a middleware: Middleware computes
// the same from the Timeout of the worker registered with AddWorker, else
// Config.JobTimeout (which must be the client's). The lease's TTL is
// min(Config.TTL, timeout/3); gofence renews it every TTL/3. The middleware
// releases it one TTL before the deadline (releasing is the only way to stop
// gofence's renewals), so no renewal ever moves its expiry past the deadline,
// also when the process is paused (a paused process renews nothing):
//
//	Work starts        deadline - TTL          deadline          River may rescue
//	    |== lease, renewed ==|-- token only --|  ...  |-> next attempt: a new lease
//
// From the release to the next grant the attempt has no live lease but its
// token is still the job's latest, so its writes still commit: nobody else
// has a token yet. Lease(ctx).Err therefore reports ErrReleased before the
// attempt is over; it is not a signal to stop. The database decides, in Tx
// and CompleteTx. When Work returns, the lease is released at once.
//
// Because the lease has ended by the deadline, the attempt that River starts
// after a rescue (never before the deadline: the rescuer skips a job younger
// than its timeout) is granted its lease at once.
//
// # Jobs without a timeout
//
// A job whose timeout is -1 (the worker's Timeout, or JobTimeout) has no
// deadline: its lease, of Config.TTL, is renewed until Work returns. River
// never rescues such a job (its rescuer skips jobs without a timeout), so no
// newer attempt competes with it; if the process pauses past the lease's
// trust deadline the lease is lost, and a later attempt (after a restart of
// the job) still gets a larger token.
//
// # When the lease cannot be had
//
// An attempt waits for its lease up to Config.AcquireTimeout (5s) while the
// previous attempt still holds it (a worker registered without AddWorker
// whose Timeout is shorter than Config.JobTimeout) or still has a fenced
// transaction open. If that time passes, Work does not run the worker and
// returns an error that matches ErrLeaseUnavailable and *river.JobSnoozeError:
// River snoozes the job (which does not use up an attempt) until the holder's
// lease expires by the server's clock, at least Config.Snooze (1s). Any other
// failure to take the lease (the database unreachable, the kit not installed,
// a grant whose reply came after its trust deadline) fails the attempt with
// an error that names the job, the attempt and the resource, and River
// retries it as its retry policy says.
//
// # Tables
//
// Protect the tables that workers write per row, by job id
// (fence.protect_rows('results', 'job_id', 'river_job:'), or
// gofence.Client.ProtectRows), and write them in Tx or CompleteTx: a write
// that presents no token fails with FN002, one with an older attempt's token
// with FN001. River's own table river_job cannot be protected: River's
// queries present no token. CompleteTx is the answer there: it locks the
// job's row (River's JobUpdateTx, which changes nothing else), checks that
// the row still runs this attempt (running, same attempt number and
// attempted_at), and only then completes it, in the fenced transaction. The
// check matters in the window after a rescue in which River has handed the
// row to a newer attempt that has not been granted its token yet: the old
// token is still the latest, so only the check keeps the old attempt from
// completing the new attempt's row (ErrJobNotRunning).
//
// # What River still does on its own
//
// When the old attempt's Work returns (with FN001, say), River finalizes the
// row as it always does, by id while it is running: if a newer attempt is
// running it then, River records the old attempt's error on that row and
// makes it retryable, and the newer attempt's CompleteTx then returns
// ErrJobNotRunning and rolls back. The job runs again, under a newer token
// still: at-least-once, nothing lost and nothing written under an old token
// after a newer one (TestManyJobsWithRandomPausesKeepAHistoryThatChecks
// checks exactly that). A completion that River makes itself (Work returning
// nil without CompleteTx) is not fenced.
//
// # River's settings that matter
//
//   - Config.JobTimeout must be the client's JobTimeout, and workers whose
//     Timeout differs must be registered with AddWorker.
//   - RescueStuckJobsAfter (River's default 1h) is how long a job runs
//     before River may rescue it; River rescues only a job older than its
//     timeout too. Only a worker that outlives its deadline is ever rescued
//     while it runs: that is the case this package is for.
//   - River's rescuer runs every 30s on the leader, so a stuck job is
//     rescued between RescueStuckJobsAfter and 30s later.
//   - Behind PgBouncer in transaction mode (tested): River with PollOnly,
//     the pool with default_query_exec_mode=exec (see gofence's README,
//     "Behind a connection pooler"), and a TTL long enough for the round
//     trips of a busy pooler: a grant whose reply comes after its trust
//     deadline is given back and fails the attempt.
package riverfence
