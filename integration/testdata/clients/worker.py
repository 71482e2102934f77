"""A job-queue worker over pgfence with psycopg 3 (docs/clients.md).

Usage: python3 worker.py DSN WORKER_NAME. Environment: TTL (seconds,
default 2), WORK (seconds of work per job, default 0), MAX_JOBS (jobs to
claim; 0: until the queue is empty).
"""
import os
import signal
import sys
import threading
import time

import psycopg

DSN, WORKER = sys.argv[1], sys.argv[2]
TTL = float(os.environ.get("TTL", "2"))
WORK = float(os.environ.get("WORK", "0"))
MAX_JOBS = int(os.environ.get("MAX_JOBS", "0"))
MARGIN = TTL / 10  # stop side effects this long before the lease could pass on


def connect():
    # prepare_threshold=None: psycopg never prepares statements on its own,
    # which PgBouncer in transaction mode would break (42P05, 26000).
    return psycopg.connect(DSN, autocommit=True, prepare_threshold=None, connect_timeout=5)


class Lease:
    """A TTL lease renewed by a thread of its own, on a connection of its
    own. It is trusted until a deadline by this machine's monotonic clock:
    the time the last successful acquire or renew was *sent*, plus the TTL,
    minus a margin. The server may grant the resource to someone else once
    its own clock passes the expiry, which is never before that deadline."""

    def __init__(self, resource, token, sent):
        self.resource, self.token = resource, token
        self.deadline = sent + TTL - MARGIN
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_alive, daemon=True)
        self._thread.start()

    def _keep_alive(self):
        conn = None
        try:
            while not self._stop.wait(TTL / 3):
                if time.monotonic() >= self.deadline:
                    self.lost.set()  # not renewed in time
                    return
                sent = time.monotonic()
                try:
                    conn = conn or connect()
                    expires = conn.execute(
                        "SELECT fence.renew(%s, %s, make_interval(secs => %s))",
                        (self.resource, self.token, TTL)).fetchone()[0]
                except psycopg.OperationalError:
                    conn = None  # transient: retry on a new connection until the deadline
                    continue
                if expires is None:
                    self.lost.set()  # NULL: expired, released, revoked or superseded
                    return
                self.deadline = sent + TTL - MARGIN
        finally:
            if conn:
                conn.close()

    def trusted(self):
        return not self.lost.is_set() and time.monotonic() < self.deadline

    def stop(self):
        self._stop.set()
        self._thread.join()


def claim(conn):
    """The first job that is not done and whose lease is not live, with its
    lease; None when there is none; "busy" when the grant answered NULL."""
    with conn.transaction():
        row = conn.execute("""
            SELECT id, payload FROM jobs j
             WHERE NOT done
               AND NOT EXISTS (SELECT FROM fence.leases l WHERE l.resource = 'job:' || j.id AND l.live)
             ORDER BY id LIMIT 1
               FOR UPDATE SKIP LOCKED""").fetchone()
        if row is None:
            return None
        sent = time.monotonic()
        token = conn.execute(
            "SELECT fence.acquire(%s, %s, make_interval(secs => %s))",
            ("job:%d" % row[0], WORKER, TTL)).fetchone()[0]
    if token is None:
        # Not granted, and not an error: a live lease holds job:N (another
        # worker claimed it since our read), or the grant waited
        # fence.grant_wait for an open write of the previous holder (busy).
        return "busy"
    return row[0], row[1], Lease("job:%d" % row[0], token, sent)


def main():
    conn = connect()
    claimed = 0
    while MAX_JOBS == 0 or claimed < MAX_JOBS:
        job = claim(conn)
        if job is None:
            print("idle", flush=True)
            break
        if job == "busy":
            time.sleep(0.05)
            continue
        job_id, payload, lease = job
        print(f"claimed {job_id} token {lease.token}", flush=True)
        claimed += 1
        try:
            time.sleep(WORK)
            result = payload.upper()  # the work
            if not lease.trusted():
                print(f"lost {job_id}", flush=True)  # the lease may be someone else's by now
                continue
            if os.environ.get("PAUSE_BEFORE_WRITE"):
                os.kill(os.getpid(), signal.SIGSTOP)  # tests: a pause here is what the fence is for
            try:
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO job_results (job_id, result, fence_token) VALUES (%s, %s, %s)"
                        " ON CONFLICT (job_id) DO UPDATE SET result = excluded.result, fence_token = excluded.fence_token",
                        (job_id, result, lease.token))
                    conn.execute("UPDATE jobs SET done = true WHERE id = %s", (job_id,))
                print(f"done {job_id}", flush=True)
            except psycopg.Error as e:
                if e.sqlstate != "FN001":
                    raise  # FN002 (no token) or FN003 (not granted for this resource): a bug
                # Stale: a newer lease of job:N exists; its holder does the job.
                print(f"refused {job_id} FN001 {e.diag.message_detail}", flush=True)
        finally:
            lease.stop()
            conn.execute("SELECT fence.release(%s, %s)", (lease.resource, lease.token))


if __name__ == "__main__":
    main()
